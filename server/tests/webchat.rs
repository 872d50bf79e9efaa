//! The web chat at `/` in a real browser: Debian's Chromium, headless, driven over WebDriver
//! (Debian's chromedriver, with fantoccini), against the server in-process on a loopback port
//! with the scripted engine (its streamed answer is known to the character). A user's session:
//! the key asked for, a picture chosen, a two-line question, the answer seen as it streams, the
//! timings line; a dropped and a pasted picture and a second turn that resends the first; a
//! refusal shown readably and the question put back; a stop that cancels the answer on the
//! server; a screenshot checked pixel by pixel. No Chromium is a failure naming the fix.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::Running;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use server::ServeOptions;

const INSTALL: &str = "apt-get install -y chromium chromium-driver";
/// A token every 15 ms: slow enough to see an answer grow, fast enough for a short test.
const TOKEN_DELAY: Duration = Duration::from_millis(15);
const ENTER: &str = "\u{E007}";
const SHIFT_ENTER: &str = "\u{E008}\u{E007}\u{E000}";
/// The test picture: left half orange, right half teal.
const ORANGE: [u8; 3] = [255, 140, 0];
const TEAL: [u8; 3] = [0, 128, 128];

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Debian's chromedriver, started on a free port; killed on drop.
struct Chromedriver {
    child: Child,
    port: u16,
}

impl Chromedriver {
    fn start() -> (Chromedriver, PathBuf) {
        let (Some(driver), Some(chromium)) = (on_path("chromedriver"), on_path("chromium")) else {
            panic!(
                "the web chat's browser test needs Chromium and ChromeDriver on PATH \
                 (chromium: {:?}, chromedriver: {:?}); install them with: {INSTALL}",
                on_path("chromium"),
                on_path("chromedriver")
            );
        };
        let mut child = Command::new(&driver)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}; reinstall with: {INSTALL}", driver.display()));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("{} exited before it listened", driver.display()))
                .unwrap();
            if let Some(p) = line.split("started successfully on port ").nth(1) {
                break p.trim_end_matches('.').trim().parse().unwrap();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        (Chromedriver { child, port }, chromium)
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium session with a fresh profile (the flags this machine needs: no sandbox
/// as root, no GPU, no connections to Google's hosts).
async fn browser(driver: &Chromedriver, chromium: &Path, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1000,900", "--force-device-scale-factor=1",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .unwrap_or_else(|e| panic!("Chromium did not start under chromedriver: {e}; {INSTALL}"))
}

async fn js(c: &Client, script: &str, args: Vec<Value>) -> Value {
    c.execute(script, args)
        .await
        .unwrap_or_else(|e| panic!("{e}: {script}"))
}

/// Polls `script` until `ready` takes its value (10 s at most).
async fn until<T>(c: &Client, what: &str, script: &str, ready: impl Fn(&Value) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = js(c, script, vec![]).await;
        if let Some(t) = ready(&v) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn find(c: &Client, css: &str) -> fantoccini::elements::Element {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
}

async fn count(c: &Client, css: &str) -> u64 {
    js(
        c,
        "return document.querySelectorAll(arguments[0]).length",
        vec![json!(css)],
    )
    .await
    .as_u64()
    .unwrap()
}

async fn prompt_value(c: &Client) -> String {
    js(c, "return document.getElementById('prompt').value", vec![])
        .await
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits for the last answer to end (finished, stopped or failed): every text seen on the way,
/// the last one, and its timings line.
async fn settle(c: &Client) -> (Vec<String>, String, String) {
    const SCRIPT: &str = "const a = [...document.querySelectorAll('.msg.assistant')].pop();
        return a ? [a.querySelector('.text').textContent, a.getAttribute('aria-busy'),
                    a.querySelector('.meta').textContent] : null";
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = js(c, SCRIPT, vec![]).await;
        if let Some(text) = v[0].as_str() {
            if seen.last().map(String::as_str) != Some(text) {
                seen.push(text.to_string());
            }
            if v[1] == "false" {
                let meta = v[2].as_str().unwrap().to_string();
                return (seen, text.to_string(), meta);
            }
        }
        assert!(Instant::now() < deadline, "no answer ended: {v}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits for the last answer, which must be `expected`: the texts seen, the timings line.
async fn last_answer(c: &Client, expected: &str) -> (Vec<String>, String) {
    let (seen, text, meta) = settle(c).await;
    assert_eq!(text, expected);
    (seen, meta)
}

/// A PNG of `w`×`h`: left half orange, right half teal.
fn picture(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let rows: Vec<u8> = (0..h)
        .flat_map(|_| (0..w).flat_map(|x| if x < w / 2 { ORANGE } else { TEAL }))
        .collect();
    let mut writer = encoder.write_header().unwrap();
    writer.write_image_data(&rows).unwrap();
    writer.finish().unwrap();
    out
}

/// A screenshot decoded to RGB rows.
struct Shot {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Shot {
    fn decode(png_bytes: &[u8]) -> Shot {
        let mut decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        let channels = info.color_type.samples();
        let rgb = buf[..info.buffer_size()]
            .chunks(channels)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        Shot {
            width: info.width as usize,
            height: info.height as usize,
            rgb,
        }
    }

    fn at(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// The pixels inside a CSS-pixel rectangle {x, y, w, h} (scale 1), `inset` pixels in.
    fn pixels(&self, rect: &Value, inset: f64) -> Vec<[u8; 3]> {
        let f = |k: &str| rect[k].as_f64().unwrap();
        let (x0, y0) = ((f("x") + inset).ceil(), (f("y") + inset).ceil());
        let (x1, y1) = (
            (f("x") + f("w") - inset).floor(),
            (f("y") + f("h") - inset).floor(),
        );
        assert!(
            x0 >= 0.0 && y0 >= 0.0 && x1 <= self.width as f64 && y1 <= self.height as f64,
            "{rect} is not inside the {}x{} screenshot",
            self.width,
            self.height
        );
        let mut out = Vec::new();
        for y in y0 as usize..y1 as usize {
            for x in x0 as usize..x1 as usize {
                out.push(self.at(x, y));
            }
        }
        out
    }
}

fn near(a: [u8; 3], b: [u8; 3], tolerance: i32) -> bool {
    a.iter()
        .zip(b)
        .all(|(&x, y)| (x as i32 - y as i32).abs() <= tolerance)
}

fn share(pixels: &[[u8; 3]], keep: impl Fn([u8; 3]) -> bool) -> f64 {
    pixels.iter().filter(|&&p| keep(p)).count() as f64 / pixels.len().max(1) as f64
}

async fn rect_of(c: &Client, css: &str) -> Value {
    js(
        c,
        "const r = [...document.querySelectorAll(arguments[0])].pop().getBoundingClientRect();
         return {x: r.x, y: r.y, w: r.width, h: r.height}",
        vec![json!(css)],
    )
    .await
}

/// Drops (or pastes) a file made in the page from `bytes`, as a user's drag from the desktop
/// (or the clipboard) would hand it over; returns whether the drop overlay showed.
async fn hand_over(c: &Client, how: &str, name: &str, mime: &str, bytes: &[u8]) -> bool {
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    js(
        c,
        "const [how, name, mime, b64] = arguments;
         const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
         const dt = new DataTransfer();
         dt.items.add(new File([bytes], name, {type: mime}));
         if (how === 'paste') {
           document.getElementById('prompt').dispatchEvent(
             new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true}));
           return false;
         }
         const log = document.getElementById('log');
         log.dispatchEvent(new DragEvent('dragenter', {dataTransfer: dt, bubbles: true}));
         log.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));
         const shown = !document.getElementById('drop-overlay').hidden;
         log.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
         return shown",
        vec![json!(how), json!(name), json!(mime), json!(b64)],
    )
    .await
    .as_bool()
    .unwrap()
}

async fn user_session(
    c: Client,
    server: SocketAddr,
    cancels: Arc<AtomicUsize>,
    open_server: SocketAddr,
    shot_path: PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let png = picture(64, 48);
    let picture_path = dir.path().join("cat.png");
    std::fs::write(&picture_path, &png).unwrap();

    c.goto(&format!("http://{server}/")).await.unwrap();
    assert_eq!(c.title().await.unwrap(), "xdna-vl chat");

    // The server has --api-key: the page asks for it; a wrong key is refused, the right one
    // kept in sessionStorage only.
    until(
        &c,
        "the key dialog",
        "return document.getElementById('key-dialog').open",
        |v| v.as_bool().filter(|&o| o),
    )
    .await;
    let key_input = find(&c, "#key-input").await;
    key_input.send_keys("open").await.unwrap();
    find(&c, "#key-submit").await.click().await.unwrap();
    until(
        &c,
        "the refusal",
        "return document.getElementById('key-message').textContent",
        |v| {
            v.as_str()
                .filter(|t| t.contains("refused"))
                .map(str::to_string)
        },
    )
    .await;
    key_input.send_keys("sesame").await.unwrap();
    key_input.send_keys(ENTER).await.unwrap();
    until(
        &c,
        "the dialog to close",
        "return document.getElementById('key-dialog').open",
        |v| v.as_bool().filter(|&o| !o),
    )
    .await;
    let stored = js(
        &c,
        "return [sessionStorage.getItem('xdna-vl.api-key'), localStorage.length, document.cookie]",
        vec![],
    )
    .await;
    assert_eq!(stored, json!(["sesame", 0, ""]));
    assert_eq!(find(&c, "#model").await.text().await.unwrap(), "· tiny");

    // Turn 1: a picture by the file picker, a question on two lines (Shift+Enter), Enter sends.
    find(&c, "#file")
        .await
        .send_keys(picture_path.to_str().unwrap())
        .await
        .unwrap();
    until(
        &c,
        "the thumbnail",
        "return document.querySelectorAll('#attachments img').length",
        |v| (v == 1).then_some(()),
    )
    .await;
    let prompt = find(&c, "#prompt").await;
    prompt.send_keys("What is in").await.unwrap();
    prompt.send_keys(SHIFT_ENTER).await.unwrap();
    prompt.send_keys("this picture?").await.unwrap();
    assert_eq!(prompt_value(&c).await, "What is in\nthis picture?");
    assert_eq!(count(&c, ".msg").await, 0, "Shift+Enter must not send");
    prompt.send_keys(ENTER).await.unwrap();
    let (seen, meta) = last_answer(&c, "echo(1): What is in\nthis picture?").await;
    // Streamed: the answer was seen part-written on the way.
    assert!(
        seen.iter()
            .filter(|t| !t.is_empty() && t.len() < 33)
            .count()
            >= 3,
        "{seen:?}"
    );
    // 24 characters + 10 for the picture; 33 answer characters.
    assert!(
        meta.starts_with("34 prompt + 33 answer tokens · first token "),
        "{meta}"
    );
    assert!(
        meta.contains(" tok/s") && meta.ends_with("(times measured in this page)"),
        "{meta}"
    );
    assert_eq!(count(&c, ".msg.user .pictures img").await, 1);
    assert_eq!(count(&c, "#attachments li").await, 0);
    assert_eq!(prompt_value(&c).await, "");
    let natural = js(
        &c,
        "const i = document.querySelector('.msg.user .pictures img');
         return [i.complete, i.naturalWidth, i.naturalHeight, i.src.slice(0, 22)]",
        vec![],
    )
    .await;
    assert_eq!(natural, json!([true, 64, 48, "data:image/png;base64,"]));

    // Turn 2: one picture dropped, one pasted, one file that is no picture refused; the first
    // turn is sent again with its picture (3 pictures in the conversation).
    assert!(hand_over(&c, "drop", "dropped.png", "image/png", &png).await);
    hand_over(&c, "paste", "pasted.png", "image/png", &png).await;
    hand_over(&c, "drop", "notes.txt", "text/plain", b"hello").await;
    until(
        &c,
        "two thumbnails",
        "return document.querySelectorAll('#attachments img').length",
        |v| (v == 2).then_some(()),
    )
    .await;
    let notice = find(&c, "#notice").await.text().await.unwrap();
    assert!(
        notice.contains("notes.txt (text/plain)") && notice.contains("PNG, JPEG, WebP and GIF"),
        "{notice}"
    );
    assert_eq!(
        js(
            &c,
            "return document.getElementById('drop-overlay').hidden",
            vec![]
        )
        .await,
        true
    );
    prompt.send_keys("And these?").await.unwrap();
    prompt.send_keys(ENTER).await.unwrap();
    let (_, meta) = last_answer(&c, "echo(3): And these?").await;
    // 34 + 33 from turn 1, 10 + 20 now.
    assert!(meta.starts_with("97 prompt + 19 answer tokens"), "{meta}");
    assert_eq!(count(&c, ".msg.user .pictures img").await, 3);

    // The screenshot: the size of the window, not blank, the answer's bubble drawn with text in
    // it on a background of its own, the last pictures' thumbnails in their colours.
    let inner = js(
        &c,
        "return [window.innerWidth, window.innerHeight, window.devicePixelRatio,
                 getComputedStyle(document.body).backgroundColor]",
        vec![],
    )
    .await;
    assert_eq!(inner[2], 1.0);
    let bytes = c.screenshot().await.unwrap();
    std::fs::write(&shot_path, &bytes).unwrap();
    let shot = Shot::decode(&bytes);
    assert_eq!(
        (shot.width as u64, shot.height as u64),
        (inner[0].as_u64().unwrap(), inner[1].as_u64().unwrap()),
        "{}",
        shot_path.display()
    );
    let mut colours: Vec<[u8; 3]> = shot.rgb.chunks(3).map(|p| [p[0], p[1], p[2]]).collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(
        colours.len() > 50,
        "a blank screenshot: {} colours",
        colours.len()
    );
    assert_eq!(inner[3], "rgb(244, 245, 247)");
    let page = [244, 245, 247];
    let bubble = shot.pixels(&rect_of(&c, ".msg.assistant .bubble").await, 3.0);
    assert!(
        share(&bubble, |p| !near(p, page, 2)) > 0.95,
        "the answer's bubble is not drawn apart from the page"
    );
    let ink = share(&bubble, |p| {
        p.iter().map(|&v| v as u32).sum::<u32>() < 3 * 140
    });
    assert!(ink > 0.02 && ink < 0.5, "the answer's text: {ink}");
    let thumb = shot.pixels(&rect_of(&c, ".msg.user .pictures img").await, 4.0);
    let (orange, teal) = (
        share(&thumb, |p| near(p, ORANGE, 12)),
        share(&thumb, |p| near(p, TEAL, 12)),
    );
    assert!(
        orange > 0.3 && teal > 0.3,
        "thumbnail: orange {orange}, teal {teal}"
    );

    // A refusal from the server, shown readably; the question goes back into the box and out
    // of the conversation.
    let long = "x".repeat(300);
    js(
        &c,
        "const p = document.getElementById('prompt'); p.value = arguments[0];
         p.dispatchEvent(new Event('input'))",
        vec![json!(long)],
    )
    .await;
    prompt.send_keys(ENTER).await.unwrap();
    let error = until(
        &c,
        "the error",
        "const e = document.querySelector('.msg.user .error');
        return e ? e.textContent : null",
        |v| v.as_str().map(str::to_string),
    )
    .await;
    assert!(
        error.starts_with("The server refused the request (400)")
            && error.contains("416 tokens, over the context of 400"),
        "{error}"
    );
    assert_eq!(prompt_value(&c).await, long);
    assert_eq!(count(&c, ".msg.user.unsent").await, 1);

    // New chat, then the long question again: stopped mid-answer, the server cancels it, the
    // part shown stays, and the next question is answered at once.
    find(&c, "#new-chat").await.click().await.unwrap();
    assert_eq!(count(&c, ".msg").await, 0);
    prompt.send_keys(ENTER).await.unwrap();
    until(
        &c,
        "a part of the answer",
        "const t = document.querySelector('.msg.assistant .text');
        return t ? t.textContent.length : 0",
        |v| (v.as_u64()? >= 20).then_some(()),
    )
    .await;
    let stop_clicked = Instant::now();
    find(&c, "#stop").await.click().await.unwrap();
    let (_, shown, meta) = settle(&c).await;
    assert!(meta.starts_with("stopped after "), "{meta}");
    assert!(
        shown.starts_with("echo(0): xxx") && shown.len() < 309,
        "{shown}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while cancels.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the server did not cancel the stopped answer"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cancelled_in = stop_clicked.elapsed();
    assert_eq!(cancels.load(Ordering::SeqCst), 1);
    assert!(find(&c, "#send").await.is_displayed().await.unwrap());
    prompt.send_keys("after").await.unwrap();
    prompt.send_keys(ENTER).await.unwrap();
    let (_, meta) = last_answer(&c, "echo(0): after").await;
    // The stopped part is in the conversation: 300 + its characters + 5.
    let expected_prompt = 300 + shown.chars().count() + 5;
    assert!(
        meta.starts_with(&format!("{expected_prompt} prompt + 14 answer tokens")),
        "{meta}"
    );
    eprintln!("the server cancelled the stopped answer {cancelled_in:?} after the click");

    // A server without a key: the page asks for none and answers.
    c.goto(&format!("http://{open_server}/")).await.unwrap();
    until(
        &c,
        "the model name",
        "return document.getElementById('model').textContent",
        |v| (v == "· tiny").then_some(()),
    )
    .await;
    assert_eq!(
        js(
            &c,
            "return document.getElementById('key-dialog').open",
            vec![]
        )
        .await,
        false
    );
    let prompt = find(&c, "#prompt").await;
    prompt.send_keys("hi").await.unwrap();
    prompt.send_keys(ENTER).await.unwrap();
    last_answer(&c, "echo(0): hi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_asks_about_pictures_in_chromium() {
    let started = Instant::now();
    let (driver, chromium) = Chromedriver::start();
    let key_server = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            api_key: Some("sesame".into()),
            ..ServeOptions::default()
        },
        TOKEN_DELAY,
    );
    let open_server = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::ZERO,
    );
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, &chromium, profile.path()).await;
    let shot_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webchat.png");
    // The session runs as its own task so that the browser is closed even when it fails.
    let session = tokio::spawn(user_session(
        client.clone(),
        key_server.addr,
        key_server.cancels.clone(),
        open_server.addr,
        shot_path.clone(),
    ))
    .await;
    let _ = client.close().await;
    drop(driver);
    if let Err(e) = session {
        std::panic::resume_unwind(e.into_panic());
    }
    key_server.stop().unwrap();
    open_server.stop().unwrap();
    eprintln!(
        "the browser session took {:?}; screenshot: {}",
        started.elapsed(),
        shot_path.display()
    );
}

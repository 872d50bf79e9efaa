//! `xdna-vl chat`: a conversation on stdin (a terminal or a pipe). A line is a message; `/image
//! FILE` attaches a picture to the next message; `/reset` forgets the conversation; `/exit` or the
//! end of input leaves. A bad command, picture or message is reported and the conversation goes on.

use std::io::{BufRead, IsTerminal, Write};

use engine::{Event, Image, Message};

use crate::cli::ChatArgs;

const HELP: &str = "commands: /image FILE (attach a picture to the next message), /reset, /exit";

pub fn chat(args: &ChatArgs) -> Result<(), String> {
    let mut session = crate::open_session(&args.model)?;
    let params = args.sampling.params(session.default_sampling());
    let inputs = args.model.template_inputs();
    engine::Sampler::new(params.clone()).map_err(|e| e.to_string())?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("xdna-vl chat: one message per line; {HELP}");
    }
    let mut pending: Vec<Image> = Vec::new();
    let mut first_turn = true;
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut line = Vec::new();
    loop {
        if interactive {
            eprint!("> ");
        }
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(format!("cannot read the input: {e}")),
        }
        let text = match std::str::from_utf8(&line) {
            Ok(t) => t.trim_end_matches(['\n', '\r']).to_string(),
            Err(e) => {
                eprintln!(
                    "error: this line is not UTF-8 text (invalid byte at offset {}); not sent",
                    e.valid_up_to()
                );
                continue;
            }
        };
        if let Some(command) = text.strip_prefix('/') {
            let (name, arg) = command
                .split_once(char::is_whitespace)
                .map_or((command, ""), |(n, a)| (n, a.trim()));
            match name {
                "exit" | "quit" => break,
                "reset" => {
                    session.reset();
                    pending.clear();
                    first_turn = true;
                    eprintln!("(conversation forgotten)");
                }
                "image" if arg.is_empty() => eprintln!("error: /image needs a file: /image FILE"),
                "image" => match session.load_image(std::path::Path::new(arg)) {
                    Ok(img) => {
                        eprintln!(
                            "(picture {} attached to the next message: {} image tokens)",
                            arg,
                            session.image_tokens(&img)
                        );
                        pending.push(img);
                    }
                    Err(e) => eprintln!("error: {e}"),
                },
                "help" => eprintln!("{HELP}"),
                _ => eprintln!("error: unknown command /{name} ({HELP})"),
            }
            continue;
        }
        if text.trim().is_empty() && pending.is_empty() {
            continue;
        }
        let user = Message::user(std::mem::take(&mut pending), text);
        if first_turn {
            if let Some(s) = &args.system {
                // The system message opens the conversation once.
                session.push_history(Message::system(s.clone()));
            }
        }
        let stdout = std::io::stdout();
        let json_out = args.json;
        let mut on_event = |e: Event<'_>| {
            if let (Event::Text(t), false) = (e, json_out) {
                let mut out = stdout.lock();
                let _ = out.write_all(t.as_bytes());
                let _ = out.flush();
            }
            true
        };
        match session.chat_with(user, &inputs, &params, &mut on_event) {
            Ok(g) if json_out => {
                first_turn = false;
                println!("{}", crate::run::generation_json(&g, &session));
                let _ = std::io::stdout().flush();
            }
            Ok(g) => {
                first_turn = false;
                println!();
                let _ = std::io::stdout().flush();
                eprintln!("{}", crate::run::timing_line(&g));
            }
            Err(e) => {
                eprintln!("error: {e}");
                if first_turn {
                    session.reset();
                }
            }
        }
    }
    Ok(())
}

//! `xdna-vl run`: one prompt, its answer streamed, then the timings.

use std::io::Write;

use engine::{Event, Generation, Message, Session};
use serde_json::json;

use crate::bundled;
use crate::cli::RunArgs;

pub fn run(args: &RunArgs) -> Result<(), String> {
    let mut session = crate::open_session(&args.model)?;
    let (prompt, image_paths) = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => (p.clone(), args.image.clone()),
        (None, Some(f)) => (crate::read_utf8(f)?, args.image.clone()),
        (None, None) if args.image.is_empty() => {
            (bundled::QUESTION.to_string(), bundled::pictures())
        }
        (None, None) => (String::new(), args.image.clone()),
    };
    if (args.prompt.is_some() || args.prompt_file.is_some()) && prompt.trim().is_empty() {
        return Err("the prompt is empty: give a question with --prompt TEXT".into());
    }
    let mut images = Vec::new();
    for path in &image_paths {
        images.push(session.load_image(path).map_err(|e| e.to_string())?);
    }
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::system(s.clone()));
    }
    messages.push(Message::user(images, prompt));
    let params = args.sampling.params(session.default_sampling());

    let stdout = std::io::stdout();
    let json_out = args.json;
    let mut on_event = |e: Event<'_>| {
        if let (Event::Text(t), false) = (e, json_out) {
            let mut out = stdout.lock();
            // A closed stdout (a pipe read to its end) is not worth failing the answer for.
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        }
        true
    };
    let g = session
        .generate_with(
            &messages,
            &args.model.template_inputs(),
            &params,
            &mut on_event,
        )
        .map_err(|e| e.to_string())?;
    if json_out {
        println!("{}", generation_json(&g, &session));
    } else {
        println!();
        let _ = std::io::stdout().flush();
        eprintln!("{}", timing_line(&g));
    }
    Ok(())
}

/// `prompt 39 tokens (10 image) | tower 1.2 ms | prefill 3,100 tok/s | decode 250 tok/s | TTFT 14.0 ms`
pub fn timing_line(g: &Generation) -> String {
    let t = &g.timings;
    format!(
        "prompt {} tokens ({} image, {} reused) | tower {:.1} ms | prefill {:.1} tok/s | decode {:.1} tok/s ({} tokens) | TTFT {:.1} ms | finish {}",
        g.prompt_tokens,
        g.image_tokens,
        g.reused_tokens,
        t.tower.as_secs_f64() * 1e3,
        t.prefill_tokens_per_s(),
        t.decode_tokens_per_s(),
        g.ids.len(),
        t.time_to_first_token.as_secs_f64() * 1e3,
        g.finish.as_str(),
    )
}

pub fn generation_json(g: &Generation, session: &Session) -> serde_json::Value {
    let t = &g.timings;
    let mut v = json!({
        "text": g.text,
        "ids": g.ids,
        "finish": g.finish.as_str(),
        "prompt_tokens": g.prompt_tokens,
        "image_tokens": g.image_tokens,
        "reused_tokens": g.reused_tokens,
        "timings": {
            "tower_ms": t.tower.as_secs_f64() * 1e3,
            "prefill_ms": t.prefill.as_secs_f64() * 1e3,
            "prefill_tokens": t.prefilled_tokens,
            "prefill_tok_s": t.prefill_tokens_per_s(),
            "decode_ms": t.decode.as_secs_f64() * 1e3,
            "decode_steps": t.decode_steps,
            "decode_forwards": t.decode_forwards,
            "drafts_proposed": t.drafts_proposed,
            "drafts_accepted": t.drafts_accepted,
            "decode_tok_s": t.decode_tokens_per_s(),
            "ttft_ms": t.time_to_first_token.as_secs_f64() * 1e3,
        },
    });
    match &g.finish {
        engine::FinishReason::Stop(s) => v["stop"] = json!(s),
        engine::FinishReason::Eos(id) => v["eos_id"] = json!(id),
        _ => {}
    }
    if let Some(ab) = session.runtime().ab_report() {
        v["ab"] = json!({
            "gemms": ab.gemms,
            "differing_gemms": ab.differing_gemms,
            "differing_values": ab.differing_values,
            "max_abs_diff": ab.max_abs_diff,
        });
    }
    v
}

//! `wgpu-llm chat`: an interactive conversation in the terminal (like `llama-cli`'s conversation
//! mode or `mlx_lm.chat`) on [`wgpu_llm::session::Session`]: the model's chat template, a system
//! message, answers streamed as they come, the history kept as KV so that a turn prefills only
//! its new tokens.
//!
//! Lines are read by a thread of their own (plain `std::io::stdin`, no line-editing crate: the
//! terminal's own line editing is enough for a prompt) and handed over a channel, so that the main
//! thread can see a Ctrl-C while it waits for one. Ctrl-C (SIGINT, caught on Unix) stops the
//! answer being generated and returns to the prompt; at the prompt, a second Ctrl-C in a row
//! leaves, as does Ctrl-D (end of input) or `/exit`.

use crate::{load_bar, progress, GpuArgs, SamplingArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;
use wgpu_llm::chat::Message;
use wgpu_llm::decode::StopReason;
use wgpu_llm::engine::{Chat, Engine, Request, Sampling};
use wgpu_llm::session::Session;

#[derive(Args)]
pub struct ChatArgs {
    /// A GGUF file or a Hugging Face folder (config.json, *.safetensors, tokenizer.json); the
    /// model must ship a chat template.
    #[arg(long)]
    model: PathBuf,
    /// Context length (KV cache positions): the whole conversation must fit; default
    /// min(model maximum, 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// System message.
    #[arg(long)]
    system: Option<String>,
    /// Generated tokens at most in each answer.
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    /// After each answer, print on stderr the tokens prefilled and reused from the KV cache,
    /// the speeds and why the answer ended.
    #[arg(long, short)]
    verbose: bool,
    /// No progress bar or banner.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    gpu: GpuArgs,
}

const HELP: &str = "commands:
  /clear        forget the conversation (the system message stays)
  /save FILE    write the conversation to FILE as JSON ({\"messages\": [{\"role\", \"content\"}, ...]})
  /load FILE    read a conversation saved by /save (or a JSON list of messages) in place of this one
  /help         this list
  /exit         leave (also Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C during an answer stops it.";

pub fn run(a: ChatArgs) -> Result<()> {
    // The checkpoint, its template and the system message are checked before the GPU is touched.
    let sampling = Sampling { seed: a.sampling.seed, ..Sampling::from(a.sampling.params()?) };
    let opened = Engine::builder(&a.model)
        .ctx(a.ctx)
        .weights(a.gpu.weight_format())
        .decode_options(a.sampling.decode()?)
        .open()?;
    if opened.checkpoint().chat_template.is_none() {
        anyhow::bail!(
            "{} ships no chat template, which `chat` needs (`generate` without --chat continues plain text)",
            a.model.display()
        );
    }
    let probe = Request { chat: Some(Chat { system: a.system.clone(), messages: vec![] }), ..Request::new("hi") };
    opened.prompt_ids(&probe)?;
    let gpu = a.gpu.open()?;
    let bar = load_bar(opened.checkpoint(), &gpu, a.quiet);
    let mut engine = opened.progress(progress(&bar)).load_on(&gpu)?;
    bar.finish_and_clear();
    let name = a.model.file_name().unwrap_or(a.model.as_os_str()).to_string_lossy().into_owned();
    if !a.quiet {
        eprintln!(
            "chat with {name} on {} (context {} tokens). /help lists the commands; Ctrl-C stops an answer, \
             Ctrl-D or /exit leaves.",
            engine.gpu().info.name,
            engine.max_ctx()
        );
    }
    let mut session = engine.session().max_tokens(a.max_tokens).sampling(sampling).sampler(a.sampling.sampler);
    if let Some(s) = &a.system {
        session = session.system(s);
    }
    interrupt::install();
    let lines = read_lines();
    let terminal = std::io::stdin().is_terminal();
    let mut interrupted_at_prompt = false;
    loop {
        // A Ctrl-C from before the prompt (the one that stopped an answer) is dropped before the
        // prompt shows: one pressed once the prompt is on screen must count.
        interrupt::take();
        if terminal {
            print!("> ");
            std::io::stdout().flush()?;
        }
        let line = match next_line(&lines) {
            Input::Line(line) => line,
            Input::End => {
                if terminal {
                    println!();
                }
                return Ok(());
            }
            Input::Interrupt if interrupted_at_prompt => {
                println!();
                return Ok(());
            }
            Input::Interrupt => {
                interrupted_at_prompt = true;
                println!();
                eprintln!("(Ctrl-C again, Ctrl-D or /exit to leave)");
                continue;
            }
        };
        interrupted_at_prompt = false;
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            match run_command(&mut session, command) {
                Ok(true) => continue,
                Ok(false) => return Ok(()),
                Err(e) if terminal => {
                    eprintln!("error: {e:#}");
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        match answer(&mut session, line, a.verbose) {
            Ok(()) => {}
            // At a terminal a failed turn is reported and the conversation goes on; a script
            // gets the error and a non-zero exit.
            Err(e) if terminal => eprintln!("error: {e:#}"),
            Err(e) => return Err(e),
        }
    }
}

/// Runs one turn: the answer streamed to stdout, stopped by Ctrl-C.
fn answer(session: &mut Session, line: &str, verbose: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    // Each piece is shown (the conversation keeps what was generated), then a Ctrl-C stops.
    let answer = session.send(line, |piece| {
        out.write_all(piece.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| wgpu_llm::Error::io("standard output", e))?;
        Ok(!interrupt::take())
    })?;
    writeln!(out)?;
    drop(out);
    let s = &answer.stats;
    if s.stop == StopReason::Caller {
        eprintln!("[stopped]");
    } else if s.stop == StopReason::ContextFull {
        eprintln!("[the context is full: /clear, or a larger --ctx]");
    }
    if verbose {
        let greedy = session.settings().sampling.temperature == 0.0;
        let seed = if greedy { String::new() } else { format!("seed {} | ", answer.seed) };
        eprintln!(
            "[prefill {} new tokens ({} reused from the KV cache), {:.1} tok/s | generated {} tokens, {:.1} tok/s | \
             {seed}stop: {:?} | context {} of {} tokens]",
            s.prompt_tokens,
            s.cached_tokens,
            s.prefill_tok_s(),
            s.generated_tokens,
            s.decode_tok_s(),
            s.stop,
            session.cached_tokens(),
            session.engine().max_ctx()
        );
    }
    Ok(())
}

/// Runs a `/command` (without its slash); false: leave.
fn run_command(session: &mut Session, command: &str) -> Result<bool> {
    let (name, arg) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
    let arg = arg.trim();
    match name {
        "exit" | "quit" => return Ok(false),
        "help" => eprintln!("{HELP}"),
        "clear" => {
            session.clear();
            eprintln!("(conversation cleared)");
        }
        "save" | "load" if arg.is_empty() => anyhow::bail!("/{name} needs a file name: /{name} FILE"),
        "save" => {
            save(session.messages(), Path::new(arg))?;
            eprintln!("(saved {} messages to {arg})", session.messages().len());
        }
        "load" => {
            let messages = load(Path::new(arg))?;
            eprintln!("(loaded {} messages from {arg})", messages.len());
            session.set_messages(messages);
        }
        _ => anyhow::bail!("unknown command /{name}; /help lists the commands"),
    }
    Ok(true)
}

/// The conversation file: `{"messages": [...]}`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    messages: Vec<Message>,
}

fn save(messages: &[Message], path: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(&Saved { messages: messages.to_vec() })?;
    std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Reads a conversation: `{"messages": [...]}` or a bare list of messages.
fn load(path: &Path) -> Result<Vec<Message>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum File {
        Saved(Saved),
        List(Vec<Message>),
    }
    match serde_json::from_str::<File>(&text) {
        Ok(File::Saved(Saved { messages }) | File::List(messages)) => Ok(messages),
        Err(_) => anyhow::bail!(
            "{} is not a conversation: want {{\"messages\": [{{\"role\": \"user\", \"content\": \"...\"}}, ...]}}",
            path.display()
        ),
    }
}

/// What the prompt got.
enum Input {
    Line(String),
    /// End of input (Ctrl-D at the start of a line) or an unreadable stdin.
    End,
    /// Ctrl-C.
    Interrupt,
}

/// Reads stdin's lines on a thread of its own (blocking reads that a signal does not end).
fn read_lines() -> Receiver<Option<String>> {
    let (send, recv) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        loop {
            let mut line = String::new();
            let got = match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line),
            };
            let end = got.is_none();
            if send.send(got).is_err() || end {
                return;
            }
        }
    });
    recv
}

/// Waits for the next line, watching for Ctrl-C.
fn next_line(lines: &Receiver<Option<String>>) -> Input {
    loop {
        if interrupt::take() {
            return Input::Interrupt;
        }
        match lines.recv_timeout(Duration::from_millis(50)) {
            Ok(Some(line)) => return Input::Line(line),
            Ok(None) | Err(RecvTimeoutError::Disconnected) => return Input::End,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Ctrl-C as a flag: SIGINT's handler sets it (with `SA_RESTART`, so no blocking call in the
/// process fails with `EINTR`); [`take`] reads and clears it. Elsewhere than Unix, Ctrl-C ends
/// the process as usual.
mod interrupt {
    use std::sync::atomic::{AtomicBool, Ordering};

    static FLAG: AtomicBool = AtomicBool::new(false);

    /// Whether Ctrl-C was pressed since the last call.
    pub fn take() -> bool {
        FLAG.swap(false, Ordering::SeqCst)
    }

    #[cfg(unix)]
    pub fn install() {
        extern "C" fn on_sigint(_: libc::c_int) {
            FLAG.store(true, Ordering::SeqCst);
        }
        // SAFETY: the handler only stores to an atomic (async-signal-safe); the sigaction struct
        // is zeroed, then filled in as sigaction(2) asks.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
        }
    }

    #[cfg(not(unix))]
    pub fn install() {}
}

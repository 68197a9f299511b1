//! The mutation corpus: several hundred corrupted GGUF files and Hugging Face folders, each
//! derived from the real SmolLM2-135M-Instruct checkpoint by one deterministic mutation
//! (tests/mutation/: truncations, header / metadata / tensor-info corruptions, absurd counts and
//! sizes, wrong types and offsets, overlapping tensors, broken JSON and configs, missing and
//! misnamed files, safetensors header corruptions, non-finite tensor values), loaded the way
//! `wgpu-llm generate` loads a model before it uploads anything: `Checkpoint::open`, the
//! tokenizer, the chat template rendered and the prompt encoded, then every tensor read from
//! its file (norms converted and checked for finite values). No GPU is needed.
//!
//! For every case this asserts:
//! - an error value (never `Ok`), and no panic (`catch_unwind`);
//! - a message of one line, under 1 KB, without control bytes or `Debug` text
//!   (`common::message_problem`);
//! - allocation bounded: the peak of live heap bytes during the case, measured by the counting
//!   `#[global_allocator]` below, at most [`ALLOC_BOUND`] above what was live before it. Opening
//!   reads headers and side files only, so a correct loader needs a small multiple of the header
//!   (the real file's 1.8 MB of vocabulary and merges, the tokenizer.json built from it): the
//!   controls peak at ~60 MiB, mostly the tokenizer, and reading their largest tensor adds its
//!   size (the 30 MB Q8_0 embedding, the 57 MB BF16 one). A loader that sized anything by a
//!   corrupted count (2^32 layers, a 2^63-byte string) would ask for gigabytes: past a hard cap
//!   of 4 GiB the allocator aborts the run at once, naming the case;
//! - done within [`CASE_SECONDS`] (a watchdog ends the run, naming the case, if one hangs).
//!
//! A sample of the cases (the first of each category and every 8th) also goes through the
//! binary: `wgpu-llm generate --chat --model CASE` must exit with status 1 and print exactly one line,
//! `error: …`, on stderr (the checkpoint is opened before the GPU, so this needs no adapter).
//!
//! The controls (the real GGUF file, its header re-emitted by the corpus's own writer, the
//! Hugging Face folder and its sharded variant) must load: they show that each case's error
//! comes from its mutation.
//!
//! Run: `cargo test --release --test corpus` (a custom harness, `harness = false`: the counts per
//! category are always printed). `cargo test --release --test corpus -- TEXT` runs the cases whose
//! "category: name" contains TEXT. Needs the SmolLM2 file (fetched by tools/fetch-model.sh on
//! first use). `CORPUS_VERBOSE=1` prints every case's message. Cases are written under the system temp dir, one at a time (sparse files: the
//! tensor data is a hole).

mod common;
mod mutation;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};
use wgpu_llm::loader::Checkpoint;

/// Most heap bytes a case may hold live above what was live when it started.
const ALLOC_BOUND: usize = 128 << 20;
/// Past this the allocator aborts the run (a runaway allocation would otherwise take the
/// machine down before the case could be judged).
const HARD_CAP: usize = 4 << 30;
/// Time limit per case (the slowest, a control that reads the whole model, takes about 1 s on
/// two loaded cores).
const CASE_SECONDS: f64 = 10.0;
/// A case still running after this is a hang: the run ends.
const WATCHDOG: Duration = Duration::from_secs(120);
/// One case in this many (and the first of each category) also runs through the binary.
const CLI_EVERY: usize = 8;

// ---------------------------------------------------------------------------------------------
// Counting allocator
// ---------------------------------------------------------------------------------------------

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static BASE: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static CASE: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn grow(n: usize) {
        let now = LIVE.fetch_add(n, Relaxed) + n;
        PEAK.fetch_max(now, Relaxed);
        if ACTIVE.load(Relaxed) && now.saturating_sub(BASE.load(Relaxed)) > HARD_CAP {
            over_cap(n);
        }
    }
    fn shrink(n: usize) {
        LIVE.fetch_sub(n, Relaxed);
    }
}

/// Says which case went past the hard cap, without allocating, and aborts.
fn over_cap(n: usize) -> ! {
    fn num(out: &mut [u8], mut v: usize) -> &[u8] {
        let mut i = out.len();
        loop {
            i -= 1;
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                return &out[i..];
            }
        }
    }
    let (mut a, mut b) = ([0u8; 24], [0u8; 24]);
    let parts: [&[u8]; 5] = [
        b"\ncorpus: case #",
        num(&mut a, CASE.load(Relaxed)),
        b" allocated past the hard cap of 4 GiB (request of ",
        num(&mut b, n),
        b" bytes); aborting\n",
    ];
    for p in parts {
        #[cfg(unix)]
        // SAFETY: writing a valid buffer to stderr.
        unsafe {
            libc::write(2, p.as_ptr().cast(), p.len());
        }
        #[cfg(not(unix))]
        let _ = p;
    }
    std::process::abort()
}

// SAFETY: forwards to the system allocator; the counters never affect what is returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        Self::grow(l.size());
        let p = System.alloc(l);
        if p.is_null() {
            Self::shrink(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        Self::grow(l.size());
        let p = System.alloc_zeroed(l);
        if p.is_null() {
            Self::shrink(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        Self::shrink(l.size());
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() {
            Self::grow(new - l.size());
        }
        let q = System.realloc(p, l, new);
        if q.is_null() {
            if new > l.size() {
                Self::shrink(new - l.size());
            }
        } else if new < l.size() {
            Self::shrink(l.size() - new);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Starts measuring a case.
fn begin(case: usize) {
    CASE.store(case, Relaxed);
    let live = LIVE.load(Relaxed);
    BASE.store(live, Relaxed);
    PEAK.store(live, Relaxed);
    ACTIVE.store(true, Relaxed);
}

/// Ends measuring: the peak of live bytes above the start.
fn end() -> usize {
    ACTIVE.store(false, Relaxed);
    PEAK.load(Relaxed).saturating_sub(BASE.load(Relaxed))
}

// ---------------------------------------------------------------------------------------------
// Loading a case
// ---------------------------------------------------------------------------------------------

use mutation::load::load;

struct Outcome {
    result: Result<Result<(), String>, String>,
    seconds: f64,
    peak: usize,
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Runs cases on a worker thread, so that a hang can be noticed.
struct Runner {
    jobs: mpsc::Sender<(usize, PathBuf)>,
    results: mpsc::Receiver<Outcome>,
}

impl Runner {
    fn new() -> Runner {
        let (jobs, job_rx) = mpsc::channel::<(usize, PathBuf)>();
        let (res_tx, results) = mpsc::channel();
        std::thread::spawn(move || {
            for (case, path) in job_rx {
                let t0 = Instant::now();
                begin(case);
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| load(&path)));
                let peak = end();
                let seconds = t0.elapsed().as_secs_f64();
                let result = r.map_err(|_| LAST_PANIC.lock().unwrap().take().unwrap_or_default());
                if res_tx.send(Outcome { result, seconds, peak }).is_err() {
                    return;
                }
            }
        });
        Runner { jobs, results }
    }

    fn run(&self, case: usize, label: &str, path: &Path) -> Outcome {
        self.jobs.send((case, path.to_path_buf())).unwrap();
        match self.results.recv_timeout(WATCHDOG) {
            Ok(o) => o,
            Err(_) => {
                eprintln!("corpus: case #{case} ({label}) did not finish in {WATCHDOG:?}: a hang");
                std::process::exit(1);
            }
        }
    }
}

/// Runs `wgpu-llm generate` on a case; returns what is wrong with how it failed, if anything.
fn cli_problem(path: &Path) -> Option<String> {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-llm"))
        .args(["generate", "--chat", "--quiet", "--max-tokens", "1", "--temperature", "0", "--prompt", "hi", "--model"])
        .arg(path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return Some("the binary did not exit within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(1) {
        return Some(format!("exit status {:?}, stderr {err:?}", out.status));
    }
    if !out.stdout.is_empty() {
        return Some(format!("stdout not empty: {:?}", String::from_utf8_lossy(&out.stdout)));
    }
    let Some(line) = err.strip_suffix('\n') else {
        return Some(format!("stderr does not end with a newline: {err:?}"));
    };
    if line.contains('\n') {
        return Some(format!("stderr has more than one line: {err:?}"));
    }
    let Some(msg) = line.strip_prefix("error: ") else {
        return Some(format!("stderr does not start with `error: `: {err:?}"));
    };
    common::message_problem(msg)
}

#[derive(Default)]
struct Tally {
    cases: usize,
    errors: usize,
    cli: usize,
    max_peak: usize,
    max_seconds: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("corpus: test");
        return;
    }
    let verbose = std::env::var_os("CORPUS_VERBOSE").is_some();
    let filter: Vec<&str> = args.iter().filter(|a| !a.starts_with('-')).map(String::as_str).collect();
    std::panic::set_hook(Box::new(|info| {
        *LAST_PANIC.lock().unwrap() = Some(info.to_string());
    }));

    let t_all = Instant::now();
    let real = common::model("smollm2");
    let ck = Checkpoint::open(&real).expect("the real checkpoint opens");
    let bases = mutation::Bases { gguf: mutation::gguf::Base::new(&real), hf: mutation::hf::Base::new(&ck) };
    drop(ck);
    let recipes = mutation::recipes(&bases);
    let dir = std::env::temp_dir().join(format!("wgpu-llm-corpus-{}", std::process::id()));
    let case_dir = dir.join("case");
    let runner = Runner::new();
    let mut failures: Vec<String> = Vec::new();

    // Controls.
    use mutation::{materialize, Kind};
    let controls: Vec<(&str, Kind, mutation::Files)> = vec![
        (
            "GGUF re-emitted by the corpus writer",
            Kind::Gguf,
            vec![(mutation::GGUF_NAME.into(), bases.gguf.emitted(|_| {}))],
        ),
        ("Hugging Face folder", Kind::Hf, bases.hf.files()),
        ("sharded Hugging Face folder", Kind::Hf, bases.hf.sharded_files()),
    ];
    let mut control_paths = vec![("the real GGUF file".to_string(), real.clone(), None)];
    for (i, (name, kind, files)) in controls.into_iter().enumerate() {
        let d = dir.join(format!("control{i}"));
        control_paths.push((name.to_string(), materialize(&d, kind, &files), Some(d)));
    }
    for (name, path, d) in &control_paths {
        let o = runner.run(0, name, path);
        match o.result {
            Ok(Ok(())) => println!("control: {name} loads ({:.2} s, peak {} MiB)", o.seconds, o.peak >> 20),
            Ok(Err(msg)) => failures.push(format!("control {name} does not load: {msg}")),
            Err(p) => failures.push(format!("control {name} panicked: {p}")),
        }
        if let Some(d) = d {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    // Cases.
    let mut tally: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut seen_category = std::collections::HashSet::new();
    for (i, r) in recipes.iter().enumerate() {
        let label = format!("{}: {}", r.category, r.name);
        if !filter.is_empty() && !filter.iter().any(|f| label.contains(f)) {
            continue;
        }
        let case = i + 1;
        let path = materialize(&case_dir, r.kind, &r.files(&bases));
        let o = runner.run(case, &label, &path);
        let t = tally.entry(r.category).or_default();
        t.cases += 1;
        t.max_peak = t.max_peak.max(o.peak);
        t.max_seconds = t.max_seconds.max(o.seconds);
        let mut fail = |what: String| failures.push(format!("#{case} {label}: {what}"));
        match &o.result {
            Err(p) => fail(format!("panicked: {}", p.replace('\n', " | "))),
            Ok(Ok(())) => fail("loaded without an error".into()),
            Ok(Err(msg)) => {
                t.errors += 1;
                if verbose {
                    println!("#{case} {label}\n    {msg}");
                }
                if let Some(p) = common::message_problem(msg) {
                    fail(p);
                }
            }
        }
        if o.peak > ALLOC_BOUND {
            fail(format!("peak allocation {} MiB is above the bound of {} MiB", o.peak >> 20, ALLOC_BOUND >> 20));
        }
        if o.seconds > CASE_SECONDS {
            fail(format!("took {:.1} s (limit {CASE_SECONDS} s)", o.seconds));
        }
        let first = seen_category.insert(r.category);
        if matches!(o.result, Ok(Err(_))) && (first || case % CLI_EVERY == 0) {
            t.cli += 1;
            if let Some(p) = cli_problem(&path) {
                fail(format!("through the CLI: {p}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!("\n{:<28} {:>6} {:>7} {:>5} {:>10} {:>9}", "category", "cases", "errors", "cli", "peak MiB", "max s");
    let mut total = Tally::default();
    for (cat, t) in &tally {
        println!(
            "{cat:<28} {:>6} {:>7} {:>5} {:>10.1} {:>9.2}",
            t.cases,
            t.errors,
            t.cli,
            t.max_peak as f64 / (1 << 20) as f64,
            t.max_seconds
        );
        total.cases += t.cases;
        total.errors += t.errors;
        total.cli += t.cli;
        total.max_peak = total.max_peak.max(t.max_peak);
        total.max_seconds = total.max_seconds.max(t.max_seconds);
    }
    println!(
        "{:<28} {:>6} {:>7} {:>5} {:>10.1} {:>9.2}\n(bounds: peak {} MiB, {CASE_SECONDS} s a case; seed {:#x}; {:.0} s in all)",
        "all",
        total.cases,
        total.errors,
        total.cli,
        total.max_peak as f64 / (1 << 20) as f64,
        total.max_seconds,
        ALLOC_BOUND >> 20,
        mutation::SEED,
        t_all.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        eprintln!("\n{} failure(s):", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
        std::process::exit(1);
    }
    println!("corpus: all {} cases failed cleanly", total.cases);
}

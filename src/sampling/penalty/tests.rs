use super::*;
use crate::gpu::tensor::test_util::{gpu_variants, random};

/// `n` token ids below `vocab` (pseudo-random, repeats likely).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    random(n, seed, 1.0).iter().map(|&x| (((x + 1.0) * 0.5 * vocab as f32) as usize).min(vocab - 1) as u32).collect()
}

/// Controls with every part on, their numbers drawn from `seed`.
fn controls(vocab: usize, seed: u64, window: u32) -> LogitControls {
    let r = random(4, seed, 1.0);
    let biased = tokens(40, vocab, seed + 1);
    let biases = random(40, seed + 2, 100.0);
    LogitControls {
        logit_bias: biased.into_iter().zip(biases).collect(),
        presence_penalty: r[0] * 2.0,
        frequency_penalty: r[1] * 2.0,
        repeat_penalty: 1.0 + r[2].abs() * 0.9 + 0.05,
        repeat_last_n: window,
    }
}

/// A sequence in `slot` with a prompt of `prompt` tokens and `generated` tokens pushed.
fn sequence(vocab: usize, seed: u64, slot: u32, window: u32, prompt: usize, generated: usize) -> SeqControls {
    let c = controls(vocab, seed, window);
    let mut s = SeqControls::start(&c, vocab, slot, &tokens(prompt, vocab, seed + 3)).unwrap().expect("on");
    for t in tokens(generated, vocab, seed + 4) {
        s.push(t);
    }
    s
}

#[test]
fn validate_names_the_field() {
    let ok = LogitControls::default();
    assert!(ok.is_off());
    ok.validate().unwrap();
    for (c, field) in [
        (LogitControls { logit_bias: vec![(3, 100.5)], ..ok.clone() }, "logit_bias"),
        (LogitControls { logit_bias: vec![(3, f32::NAN)], ..ok.clone() }, "logit_bias"),
        (LogitControls { presence_penalty: -2.5, ..ok.clone() }, "presence_penalty"),
        (LogitControls { frequency_penalty: f32::NAN, ..ok.clone() }, "frequency_penalty"),
        (LogitControls { repeat_penalty: 0.0, ..ok.clone() }, "repeat_penalty"),
        (LogitControls { repeat_penalty: f32::INFINITY, ..ok.clone() }, "repeat_penalty"),
        (LogitControls { repeat_last_n: MAX_WINDOW + 1, ..ok.clone() }, "repeat_last_n"),
    ] {
        let (name, msg) = c.check().unwrap_err();
        assert_eq!(name, field);
        assert!(msg.contains(field), "{msg}");
    }
    let far = LogitControls { logit_bias: vec![(10, 1.0)], ..ok.clone() };
    assert!(format!("{}", far.validate_for(10).unwrap_err()).contains("logit_bias"));
    far.validate_for(11).unwrap();
    // A penalty of 1 or a window of 0 is off; every other part alone is on.
    assert!(LogitControls { repeat_penalty: 1.3, repeat_last_n: 0, ..ok.clone() }.is_off());
    assert!(!LogitControls { repeat_penalty: 1.3, ..ok.clone() }.is_off());
    assert!(!LogitControls { repeat_penalty: 1.3, repeat_last_n: REPEAT_ALL, ..ok.clone() }.is_off());
    assert!(!LogitControls { presence_penalty: 0.1, ..ok.clone() }.is_off());
    assert!(SeqControls::start(&ok, 10, 0, &[1, 2]).unwrap().is_none());
}

#[test]
fn the_spec_by_hand() {
    // Bias, then repetition (divide positive logits, multiply the rest), then frequency and
    // presence on generated tokens only.
    let c = LogitControls {
        logit_bias: vec![(0, 5.0), (1, -1.0), (0, 1.0)],
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        repeat_penalty: 2.0,
        repeat_last_n: 2,
    };
    // Prompt 1 2 3 (window: 2 3), then generated 3 4 (window: 3 4; c[3] = c[4] = 1).
    let mut s = SeqControls::start(&c, 6, 0, &[1, 2, 3]).unwrap().unwrap();
    s.push(3);
    s.push(4);
    let mut l = [1.0f32, 3.0, 4.0, 4.0, -1.0, 7.0];
    s.apply(&mut l);
    // 0: 1 + 1 (the later bias wins); 1: 3 - 1, out of the window now; 2: out of the window;
    // 3: 4 / 2 - 0.25 - 0.5; 4: -1 · 2 - 0.25 - 0.5; 5: untouched.
    assert_eq!(l, [2.0, 2.0, 4.0, 1.25, -2.75, 7.0]);
}

#[test]
fn host_apply_follows_the_dense_twin() {
    let vocab = 700;
    for (window, seed) in [(64, 10), (REPEAT_ALL, 20), (1, 30), (MAX_WINDOW, 40)] {
        let s = sequence(vocab, seed, 0, window, 300, 120);
        let logits = random(vocab, seed + 5, 12.0);
        let mut host = logits.clone();
        s.apply(&mut host);
        let mut dense = logits.clone();
        cpu::sample_penalty(&mut dense, &s.state_words(), &[s.row], vocab);
        assert_eq!(bits(&host), bits(&dense), "window {window}");
        assert_ne!(bits(&host), bits(&logits), "the controls change the row");
    }
}

#[test]
fn token_counts_twin_follows_push() {
    let vocab = 300;
    // A long prompt wraps the ring (MAX_WINDOW) for the widest window.
    for (window, prompt) in [(8, 20), (REPEAT_ALL, 50), (MAX_WINDOW, MAX_WINDOW as usize + 37), (5, 3)] {
        let mut s = sequence(vocab, 7, 0, window, prompt, 10);
        let mut state = s.state_words();
        for t in tokens(40, vocab, 99) {
            cpu::token_counts(&[t], &mut state, &[s.row], vocab);
            s.push(t);
            let want = s.state_words();
            assert!(live(&state, vocab, window) == live(&want, vocab, window), "window {window}, token {t}");
        }
    }
}

/// A slot's words less the ring entries that have left the window (stale ids the kernel leaves).
fn live(state: &[u32], vocab: usize, window: u32) -> Vec<u32> {
    let mut s = state.to_vec();
    let len = s[layout::LEN] as usize;
    let kept = if window == REPEAT_ALL { 0 } else { len.min(window as usize) };
    let hist = MAX_WINDOW as usize;
    let live: std::collections::HashSet<usize> = (len - kept..len).map(|p| p % hist).collect();
    for j in 0..hist {
        if !live.contains(&j) {
            s[layout::ring(vocab) + j] = 0;
        }
    }
    s
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Two sequences in slots 0 and 1 behind rows 2 and 0 of three (row 1 has no controls).
fn setup(vocab: usize) -> (Vec<SeqControls>, Vec<ControlRow>, Vec<u32>) {
    let a = sequence(vocab, 1, 0, 64, 200, 90);
    let b = sequence(vocab, 2, 1, MAX_WINDOW, MAX_WINDOW as usize + 5, 30);
    let rows = vec![ControlRow { row: 2, ..a.row }, ControlRow { row: 0, ..b.row }];
    let state = [a.state_words(), b.state_words()].concat();
    (vec![a, b], rows, state)
}

fn info_buffer(gpu: &Gpu, rows: usize, vocab: usize) -> wgpu::Buffer {
    gpu.uniform("control info", &ControlInfo::new(rows, vocab))
}

#[test]
fn sample_penalty_matches_cpu_bit_for_bit() {
    // 1000 is not a multiple of the workgroup: the last one is partial.
    let vocab = 1000;
    let (_, rows, state) = setup(vocab);
    let logits = random(3 * vocab, 5, 30.0);
    let mut want = logits.clone();
    cpu::sample_penalty(&mut want, &state, &rows, vocab);
    for gpu in gpu_variants() {
        let l = gpu.upload_f32("logits", &[3, vocab], &logits).unwrap();
        let st = gpu.upload_u32("state", &[state.len()], &state).unwrap();
        let records: Vec<u32> = bytemuck::cast_slice(&rows).to_vec();
        let rec = gpu.upload_u32("rows", &[records.len()], &records).unwrap();
        let info = info_buffer(&gpu, rows.len(), vocab);
        let b = ControlBindings { state: &st, records: &rec, info: &info, rows: rows.len() };
        let k = sample_penalty(&gpu, &l, &b, vocab).unwrap();
        gpu.run(&[&k]).unwrap();
        let got = gpu.read_f32(&l).unwrap();
        assert_eq!(bits(&got), bits(&want));
        assert_eq!(bits(&got[vocab..2 * vocab]), bits(&logits[vocab..2 * vocab]), "row 1 has no controls");
    }
}

#[test]
fn token_counts_matches_cpu_over_steps() {
    let vocab = 1000;
    let (_, rows, state) = setup(vocab);
    for gpu in gpu_variants() {
        let mut want = state.clone();
        let st = gpu.upload_u32("state", &[state.len()], &state).unwrap();
        let records: Vec<u32> = bytemuck::cast_slice(&rows).to_vec();
        let rec = gpu.upload_u32("rows", &[records.len()], &records).unwrap();
        let info = info_buffer(&gpu, rows.len(), vocab);
        for step in 0..12 {
            let ids = tokens(3, vocab, 500 + step);
            let t = gpu.upload_u32("ids", &[3], &ids).unwrap();
            let b = ControlBindings { state: &st, records: &rec, info: &info, rows: rows.len() };
            let k = token_counts(&gpu, &t, &b).unwrap();
            gpu.run(&[&k]).unwrap();
            cpu::token_counts(&ids, &mut want, &rows, vocab);
        }
        assert_eq!(gpu.read_u32(&st).unwrap(), want);
    }
}

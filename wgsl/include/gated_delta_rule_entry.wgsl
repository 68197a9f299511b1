// gated_delta_rule_entry: the start of both gated delta rule kernels' entry point (pasted where
// the kernel's `main` begins: it opens `main`, the kernel's body follows and closes it). Each
// thread takes its share of a head's state (include/gated_delta_rule_io.wgsl, share_of): returns
// for workgroups past the last head or a batch step's rows (uniform), then names h, kh (its key
// head), c, r (its column and row group), j, i0, n (the pass: its rows sh.row0 .. sh.row0 + n),
// and loads its rows of the state into s.
@compute @workgroup_size({{CB}}, {{RG}}, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let sh = share_of(wid, nwg, lid3);
    if (sh.h >= p.v_heads || sh.n == 0u) {
        return;  // uniform across the workgroup
    }
    let h = sh.h;
    let kh = sh.kh;
    let c = lid3.x;
    let r = lid3.y;
    let j = sh.j;
    let i0 = sh.i0;
    let n = sh.n;
    var s = load_state(sh);
    let decay_rate = -exp(a_log[h]);

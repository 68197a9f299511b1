// entry_subgroup: the opening of the entry point of the kernels that reduce through subgroups
// when they can (matvec.wgsl, matvec_quant.wgsl, moe_router.wgsl): WG threads a workgroup on a
// 2-D folded grid (workgroup number wid.x + wid.y · nwg.x), the thread's index lid, and with
// SUBGROUP its subgroup's size and its lane in it. Pasted where `main` begins: the kernel's body
// follows and closes it.
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
#ifdef SUBGROUP
        @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_lane: u32,
#endif
        @builtin(local_invocation_index) lid: u32) {

// entry: the opening of a kernel's entry point: WG threads a workgroup on a 2-D folded grid
// (workgroup number wid.x + wid.y · nwg.x) and the thread's index lid in its workgroup. Pasted
// where `main` begins: the kernel's body follows and closes it. (include/entry_thread adds the
// thread's index on the whole grid; include/entry_subgroup is the opening with subgroup builtins.)
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {

// tree_sum: the workgroup adds one value a thread through workgroup memory, halving the active
// threads each step (WG a power of two); afterwards slot 0 of the array holds the sum. Pasted
// inside a function body of a kernel whose entry point has `lid` (local_invocation_index), once a
// kernel; before the #include the kernel defines
//   TREE    its workgroup array of at least WG slots (of any type that has +),
//   TREE_V  the thread's value (an expression),
//   TREE_H  the name of the loop's variable (the half-width of the step).
// Call from uniform control flow. Used by rms_norm, rms_norm_gated, rope, moe_router, sample_logprobs and
// include/linear_input (the fused norm of the matvecs).
    {{TREE}}[lid] = {{TREE_V}};
    workgroupBarrier();
    for (var {{TREE_H}} = {{WG}}u / 2u; {{TREE_H}} > 0u; {{TREE_H}} >>= 1u) {
        if (lid < {{TREE_H}}) {
            {{TREE}}[lid] += {{TREE}}[lid + {{TREE_H}}];
        }
        workgroupBarrier();
    }

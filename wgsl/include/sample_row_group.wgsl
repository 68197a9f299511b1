// sample_row_group: statements pasted into the entry point of the sampler's per-group passes
// (sample_stats.wgsl, sample_histogram.wgsl), after `lid`: the workgroup's (row, group) of the
// 2-D folded grid of rows × info.groups workgroups (returns past the last row's groups: uniform),
// and the row's sampling parameters p (sampling: not greedy).
    let w = wid.x + wid.y * nwg.x;
    let groups = info.groups;
    if (w >= info.rows * groups) {
        return;
    }
    let row = w / groups;
    let g = w - row * groups;
    let p = params[row];
    let sampling = p.mode != MODE_GREEDY;

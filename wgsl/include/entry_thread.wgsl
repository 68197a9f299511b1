// entry_thread: include/entry, then i, the thread's index on the whole (folded) grid, for the
// kernels that give each thread one element. Pasted where `main` begins: the kernel's body follows
// and closes it.
#include "entry"
    let i = (wid.x + wid.y * nwg.x) * {{WG}}u + lid;

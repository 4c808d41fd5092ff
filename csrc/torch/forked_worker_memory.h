// What a forked worker reads instead of its parent's managed memory.
//
// fork() does not carry managed memory into the child. Before a DataLoader
// forks its workers, the parent copies the managed CPU storages the workers
// will read into ordinary memory, which the child inherits copy-on-write;
// right after the fork, each child points those storages at its image of the
// copy (torch_uvm/_workers.py). The parent's storages are left as they were.
#pragma once

#include <ATen/ATen.h>

namespace torch_uvm {

// In a forked child: `storage_owner`'s storage now reads `copy`'s memory, for
// every view of it. The parent's managed memory it pointed to is neither read
// nor freed by the child. `copy` must be an ordinary CPU tensor of at least
// the storage's bytes.
void adopt_copy_in_forked_child(const at::Tensor& storage_owner, const at::Tensor& copy);

}  // namespace torch_uvm

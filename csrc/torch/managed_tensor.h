// What makes a tensor managed, and the Storage that lets one allocation be
// seen as a tensor of another device (RFC-0023's RealStorage / Indirect).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "core/snapshot.h"

namespace torch_uvm {

// The managed allocation under `t`'s storage, if any.
std::optional<AllocationInfo> managed_allocation(const at::Tensor& t);

// The byte range [first, first + bytes) that `t`'s elements occupy.
std::pair<const void*, std::size_t> tensor_span(const at::Tensor& t);

// `source`'s memory seen as a Storage of `target`, holding a reference to
// `source`: the memory lives until both are gone.
c10::Storage storage_seen_on(const c10::Storage& source, at::Device target,
                             c10::Allocator* allocator, bool resizable);

// A tensor of `target` over the same memory as `t`, with t's offset, sizes
// and strides. Its storage holds a reference to t's storage, so the
// allocation lives until both are gone.
at::Tensor alias_on_device(const at::Tensor& t, at::Device target);

}  // namespace torch_uvm

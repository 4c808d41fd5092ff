// A PyTorch CUDA stream as the runtime layer names it (core/types.h).
#pragma once

#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "core/types.h"

namespace torch_uvm {

inline StreamRef stream_ref(const c10::cuda::CUDAStream& s) {
  return {s.device_index(), reinterpret_cast<std::uintptr_t>(s.stream())};
}

}  // namespace torch_uvm

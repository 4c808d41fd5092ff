// Tensor.record_stream for managed CUDA tensors made while UVM is off
// (record_stream.cpp).
#pragma once

namespace torch_uvm {

// Registers torch_uvm's aten::record_stream kernel for CUDA (once).
void register_record_stream_kernel();

}  // namespace torch_uvm

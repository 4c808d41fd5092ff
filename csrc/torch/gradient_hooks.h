// One call per unit when its gradients are complete, not one per parameter:
// a hook after each trainable parameter's gradient accumulates (a post hook
// on its AccumulateGrad node, in C++) counts it in the offload's lifecycle
// (core/unit_lifecycle.h), and only a unit's last gradient calls back
// (torch_uvm/offload_training.py sends the gradients home or steps them).
//
// The hooks run where autograd accumulates: on its device thread, after any
// hook registered on the parameter itself (register_post_accumulate_grad_hook)
// and in order with other post hooks of its accumulator (DDP's reducer adds
// its own when it wraps the module: after the offload, so after these).
// The accumulators are held while hooked (each holds its parameter): remove()
// lets go of them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "core/unit_lifecycle.h"

namespace torch_uvm {

class GradientHooks {
 public:
  using Complete = std::function<void(int unit)>;
  GradientHooks(std::shared_ptr<UnitLifecycle> lifecycle, Complete complete);
  ~GradientHooks();
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;

  // Counts `param`'s gradients for `unit` from now (a leaf that requires
  // grad; hooked once, whatever the unit it is given for next).
  void add(int unit, const at::Tensor& param);
  bool hooked(const at::Tensor& param) const;
  std::size_t size() const { return hooked_.size(); }
  // Every hook leaves its accumulator (undo).
  void remove();

 // What every hook holds: the lifecycle and the call (gradient_hooks.cpp).
  struct Shared;

 private:
  struct Hooked;
  std::shared_ptr<Shared> shared_;
  std::unordered_map<const c10::TensorImpl*, std::unique_ptr<Hooked>> hooked_;
};

}  // namespace torch_uvm

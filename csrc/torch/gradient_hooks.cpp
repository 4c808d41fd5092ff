#include "torch/gradient_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

#include "core/errors.h"

namespace torch_uvm {

struct GradientHooks::Shared {
  std::shared_ptr<UnitLifecycle> lifecycle;
  Complete complete;
};

namespace {

using Accumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<at::Tensor>()));

struct CountGradient : torch::autograd::FunctionPostHook {
  CountGradient(std::shared_ptr<GradientHooks::Shared> shared, int unit)
      : shared(std::move(shared)), unit(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (shared->lifecycle->gradient(unit, torch::autograd::get_current_graph_task_id())) {
      shared->complete(unit);
    }
    return outputs;
  }
  std::shared_ptr<GradientHooks::Shared> shared;
  int unit;
};

}  // namespace

struct GradientHooks::Hooked {
  Accumulator accumulator;
  std::uintptr_t key;
};

GradientHooks::GradientHooks(std::shared_ptr<UnitLifecycle> lifecycle, Complete complete)
    : shared_(std::make_shared<Shared>(Shared{std::move(lifecycle), std::move(complete)})) {}

GradientHooks::~GradientHooks() { remove(); }

void GradientHooks::add(int unit, const at::Tensor& param) {
  if (hooked(param)) return;
  TORCH_UVM_CHECK_ARG(param.is_leaf() && param.requires_grad(),
                      "torch_uvm: a gradient hook goes on a leaf that requires grad");
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  TORCH_UVM_CHECK_ARG(accumulator, "torch_uvm: the parameter has no gradient accumulator");
  const std::uintptr_t key =
      accumulator->add_post_hook(std::make_unique<CountGradient>(shared_, unit));
  hooked_.emplace(param.unsafeGetTensorImpl(),
                  std::make_unique<Hooked>(Hooked{std::move(accumulator), key}));
}

bool GradientHooks::hooked(const at::Tensor& param) const {
  return hooked_.count(param.unsafeGetTensorImpl()) > 0;
}

void GradientHooks::remove() {
  for (auto& [impl, h] : hooked_) h->accumulator->del_post_hook(h->key);
  hooked_.clear();
}

}  // namespace torch_uvm

// StreamExecutor (stream_executor.h): training. What is trainable, the
// gradients a backward makes (adopted into the budget, then sent home or
// discarded after a step in backward), and an optimizer's step one
// submodule at a time: its weights, gradients and states brought, what it
// wrote written home, the states it made adopted.
#include "torch/stream_executor.h"

#include <algorithm>
#include <optional>

#include "torch/pinned_home.h"
#include "torch/stream_ref.h"
#include "torch/trace_scope.h"

namespace torch_uvm {
namespace {

// Whether `t` owns all of its storage from its start (a streamed tensor
// takes the whole storage) and is large enough to be worth streaming.
bool streamable(const at::Tensor& t) {
  return t.is_cuda() && t.storage_offset() == 0 &&
         t.nbytes() >= StreamExecutor::kSmallestStreamed &&
         t.storage().nbytes() == static_cast<std::size_t>(t.nbytes());
}

}  // namespace

void StreamExecutor::set_training(bool training) { schedule_.set_training(training); }

std::size_t StreamExecutor::storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::size_t sum = 0;
  for (const at::Tensor& t : tensors) sum += t.storage().nbytes();
  return sum;
}

void StreamExecutor::set_trainable(int unit, const std::vector<at::Tensor>& trainable) {
  Unit& u = units_.at(unit);
  std::vector<int> grads;
  for (const at::Tensor& p : trainable) {  // frozen and unfrozen again: its gradient's home
    const auto it = u.grad_ids.find(p.unsafeGetTensorImpl());
    grads.push_back(it == u.grad_ids.end() ? -1 : it->second);
  }
  u.trainable = trainable;
  u.grads = std::move(grads);
  schedule_.set_trainable_bytes(unit, storage_bytes(trainable));
}

std::size_t StreamExecutor::largest_trainable() const { return schedule_.largest_trainable(); }

std::size_t StreamExecutor::new_grad_bytes(const Unit& u) const {
  std::size_t sum = 0;
  for (const at::Tensor& p : u.trainable) {
    if (!p.grad().defined()) sum += p.storage().nbytes();
  }
  return sum;
}

void StreamExecutor::adopt(int id) {
  StreamedTensor& t = *entries_[id].tensor;
  homes_.reap();
  t.adopt();
  carry_out(budget_.admit(device_.index(), key(id), t.nbytes(), true, share_, false));
}

void StreamExecutor::grads_ready(int unit, bool send_home, bool wait_home) {
  Unit& u = units_.at(unit);
  std::vector<int> fresh;
  for (std::size_t k = 0; k < u.trainable.size(); ++k) {
    at::Tensor g = u.trainable[k].grad();
    if (!g.defined() || entry_for(g) >= 0) continue;  // none, or accumulated where it is
    TORCH_CHECK(g.is_cuda() && g.storage_offset() == 0 &&
                    g.storage().nbytes() == static_cast<std::size_t>(g.nbytes()),
                "torch_uvm: the gradient of '", u.name, "' shares its memory with other "
                "tensors; torch_uvm streams gradients that own their memory");
    int& gid = u.grads[k];
    if (gid < 0) {
      gid = add_entry(g, StreamedTensor::Memory::kSlot, u.name + ".grad");
      u.grad_ids[u.trainable[k].unsafeGetTensorImpl()] = gid;
      homes_.reap();
      carry_out(budget_.admit(device_.index(), key(gid), g.nbytes(), true, share_, false));
    } else {
      Entry& e = entries_[gid];
      if (e.tensor->has_target()) by_target_.erase(e.tensor->target().unsafeGetTensorImpl());
      if (e.tensor->in_slot()) {  // the last step's, still on the GPU: it died
        budget_.discard(key(gid));
        abandon(gid);
      }
      e.tensor->retarget(g);
      by_target_[g.unsafeGetTensorImpl()] = gid;
      adopt(gid);
    }
    fresh.push_back(gid);
  }
  note_use(fresh);  // made by the backward on this stream
  if (send_home && !fresh.empty()) {
    evict_now(fresh);  // adopted written: they go home
    // .grad now points at its home while the copy there is under way: what
    // the compute stream does next with it (DDP copies it into a bucket,
    // then writes the averaged gradient back) comes after the copy
    if (wait_home) homes_.block(stream_ref(compute()));
  }
  after(unit);
}

void StreamExecutor::discard_grads(int unit) {
  for (int gid : units_.at(unit).grads) {
    if (gid < 0) continue;
    Entry& e = entries_[gid];
    if (!e.tensor->has_target()) continue;
    TraceScope scope("discard", e.name, e.tensor->nbytes());  // dies on the GPU: no copy
    by_target_.erase(e.tensor->target().unsafeGetTensorImpl());
    budget_.discard(key(gid));
    abandon(gid);
  }
}

void StreamExecutor::step_queued(std::size_t steps_behind) {
  steps_behind_.queued(stream_ref(compute()));
  steps_behind_.at_most(steps_behind);
}

void StreamExecutor::step_begins() { step_inputs_.record(stream_ref(compute())); }

std::string StreamExecutor::owner_of(const std::vector<at::Tensor>& tensors) const {
  for (const at::Tensor& t : tensors) {
    if (const int id = entry_for(t); id >= 0) return entries_[id].name;
  }
  return "optimizer";
}

void StreamExecutor::bring(const std::vector<at::Tensor>& tensors, std::size_t new_bytes) {
  std::vector<int> ids;
  for (const at::Tensor& t : tensors) {
    int id = entry_for(t);
    // a home it did not make: an optimizer state load_state_dict put there
    if (id < 0 && streamable(t) && is_pinned_home(t.storage().data_ptr())) {
      id = add_entry(t, StreamedTensor::Memory::kHome, owner_of(tensors) + ".state");
    }
    if (id >= 0 && entries_[id].tensor->has_target()) ids.push_back(id);
  }
  step_inputs_.block(stream_ref(bring_stream_));  // (a step in backward: long done)
  std::optional<TraceScope> scope;
  bring_entries(ids, bring_stream_, false, false, [&](std::size_t bytes) {
    scope.emplace("bring_for_step", entries_[ids.front()].name, bytes, stream_ref(bring_stream_));
  });
  wait_ready(ids);
  note_use(ids);  // a step may run on a stream of its own (step_in_backward)
  try {
    room_for(new_bytes);  // after the bring: its admits must not take the room
  } catch (...) {
    for (int id : ids) release(id);
    throw;
  }
  step_held_.insert(step_held_.end(), ids.begin(), ids.end());
}

void StreamExecutor::step_done(const std::vector<at::Tensor>& tensors,
                               const std::vector<at::Tensor>& written) {
  std::vector<int> ids;
  const std::string owner = owner_of(tensors);  // new states are named by the step's first weight
  for (const at::Tensor& t : tensors) {
    int id = entry_for(t);
    if (id < 0) {  // made by the step (an optimizer state): on the GPU now
      if (!streamable(t)) continue;
      id = add_entry(t, StreamedTensor::Memory::kSlot, owner + ".state");
      homes_.reap();
      carry_out(budget_.admit(device_.index(), key(id), t.nbytes(), true, share_, false));
    }
    ids.push_back(id);
  }
  for (const at::Tensor& t : written) {
    const int id = entry_for(t);
    if (id >= 0) budget_.mark_written(key(id));
  }
  note_use(ids);  // the states it made, on the step's stream
  std::vector<int> held;
  held.swap(step_held_);
  for (int id : held) release(id);
  evict_now(ids);
}

}  // namespace torch_uvm

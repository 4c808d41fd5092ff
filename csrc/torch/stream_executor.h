// How an offloaded module streams through its share of a GPU's residency
// budget: the per-submodule work of a forward, a backward and an optimizer
// step (bring, wait, evict, write home). It is C++ because it runs for every
// submodule on every pass: torch_uvm/offload.py's hooks only call it. What
// stays and what leaves is core/residency's; how one tensor arrives and
// leaves is streamed_tensor's. The definitions: stream_executor.cpp (the
// books and the plan), stream_executor_memory.cpp (the arena, the homes,
// what leaves), stream_executor_pass.cpp (a pass: bring ahead, let go) and
// stream_executor_training.cpp (gradients and steps). What decides when a
// unit comes and goes (the route, what is brought ahead, what a pass lets
// go) is core/unit_schedule.h's; this carries it out on tensors and streams.
//
// Memory: every slot a bring draws comes from one range of the share's
// budget (core/slot_arena.h), so the GPU memory it streams through is the
// budget, whatever the sizes of its tensors.
//
// Streams: submodules' tensors are brought on a stream of the executor's
// ("bring"), and written home on another ("home"), so both directions of the
// link and the compute stream overlap. The compute stream (the caller's
// current stream) waits for a bring before the submodule's kernels; a
// copy home waits for the kernels that wrote the slot; a slot goes back to
// the allocator only once every stream that used it has passed.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/home_copies.h"
#include "core/residency.h"
#include "core/resident_plan.h"
#include "core/steps_behind.h"
#include "core/unit_schedule.h"
#include "torch/streamed_tensor.h"

namespace torch_uvm {

class StreamExecutor {
 public:
  // Optimizer states smaller than this (a step count) stay where the
  // optimizer put them: moving them would cost more calls than bytes.
  static constexpr std::size_t kSmallestStreamed = 64 << 10;

  // `share`: the budget it streams in (core/residency.h). `in_place`:
  // streamed submodules are read where they live (kernels read their homes
  // over PCIe); only the resident ones come to the GPU. `training`: its
  // forwards are followed by a backward (gradients and an optimizer's
  // states stream too), not by the next forward, so a pass does not wrap
  // round.
  StreamExecutor(ResidencyBudget& budget, ShareId share, c10::Device device, int ahead,
                 bool in_place, bool training);
  ~StreamExecutor();

  // A submodule: `targets` are its parameters and buffers (CUDA tensors
  // over pinned homes: pinned_home.h), `trainable` the parameters whose
  // gradients it streams. A tensor shared by two submodules (tied weights)
  // is one streamed tensor. `buffers`: the targets that are buffers, which
  // a forward may write without moving their version counter (BatchNorm's
  // running statistics): each that ran in a slot goes home when it leaves.
  // Returns the unit's index.
  int add_unit(const std::string& name, const std::vector<at::Tensor>& targets,
               const std::vector<at::Tensor>& trainable,
               const std::vector<at::Tensor>& buffers = {});

  // After the first forward (which ran the units on demand, in the order
  // noted by before()): decides the resident units (core/resident_plan.h:
  // for inference a suffix of that order, for training a prefix, beside a
  // window of `per_streamed` times the largest streamed unit and `per_any`
  // times the largest unit's trainable parameters: a frozen unit steps
  // nothing) and brings them.
  void plan(std::size_t per_streamed, std::size_t per_any);
  bool planned() const { return schedule_.planned(); }
  // Before plan(): the bytes a pass would bring with that window (a
  // streamed unit's pieces no resident unit holds, summed), to compare
  // ways of streaming; and the choice of one, and of whether it trains (an
  // offload planned for inference is planned again for training: evict_all,
  // set_training, plan).
  std::size_t streamed_per_pass(std::size_t per_streamed, std::size_t per_any) const;
  void set_in_place(bool in_place);
  void set_training(bool training);
  // The unit's parameters that require grad now (frozen or unfrozen since):
  // whose gradients it streams. A parameter that stays keeps its gradient's
  // streamed tensor.
  void set_trainable(int unit, const std::vector<at::Tensor>& trainable);
  // The largest unit's trainable bytes (what a step of it brings beside its
  // weights is sized by).
  std::size_t largest_trainable() const;
  const std::vector<int>& order() const { return schedule_.order(); }
  bool resident(int unit) const { return schedule_.resident(unit); }

  // Forward (or backward, in reverse order): the unit is about to run, its
  // tensors are on the GPU for the compute stream, and the next streamed
  // units are brought meanwhile, `ahead` of the largest one's bytes (the
  // whole window while a resident unit runs). Before plan(): brought on
  // demand. Units brought ahead that the pass went past without running
  // them (a branch not taken, an expert not routed to, a frozen unit whose
  // backward autograd skips) stop holding their slots.
  void before(int unit, bool backward);
  // The unit's kernels are queued: it may leave when room is needed.
  void after(int unit);

  // The unit's gradients are complete (read from its trainable parameters'
  // .grad): they are counted in the budget and, `send_home`, written home
  // at once (the parameters' .grad then live in host memory), and, unless
  // `!wait_home`, the compute stream's next work waits for that copy (a
  // host step waits on the home stream instead, and the backward goes on).
  // Releases the unit's weights, as after() does.
  void grads_ready(int unit, bool send_home, bool wait_home = true);
  // The unit's gradients died (an optimizer step in backward set them to
  // None): let go of them, counted as discarded.
  void discard_grads(int unit);

  // optimizer.step() begins: what the compute stream queued so far (the
  // backward, and whatever the user did to the gradients after it: DDP's
  // averaging, an all_reduce by hand, a write through .data, which moves no
  // version counter) comes before every bring() of this step.
  void step_begins();
  // For an optimizer step: `tensors` (weights, gradients, states of the
  // known ones, and states in homes it did not make: loaded ones) on the
  // GPU for the compute stream (the current one: the step may run on a
  // stream of its own), held until step_done.
  // `new_bytes`: what the step will make on the GPU (its first states):
  // room is made for them.
  void bring(const std::vector<at::Tensor>& tensors, std::size_t new_bytes = 0);
  // The step is queued: `written` were written by it; tensors it made
  // (new optimizer states, on the GPU) are adopted into the budget. All of
  // `tensors` but a resident unit's go home now (written ones by a copy).
  void step_done(const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& written);

  // End of a pass (forward or backward): holds it left are released (in
  // training, of every unit brought ahead: no pass wraps round), and the
  // compute stream waits for copies home under way, so that the user's
  // next kernels see every home up to date.
  void end_pass();
  // What is not in use nor resident leaves the GPU now (written data goes
  // home).
  void evict_unused();
  // The unit's weights leave the GPU now unless held or resident (a step on
  // the host is about to write their homes: the next bring copies those).
  void evict_unit(int unit);
  // A step on the host writes the unit's homes from now (`busy`) until it
  // is done (torch_uvm/host_step.py): no bring copies them meanwhile. A
  // bring ahead stops before it (the unit comes on demand, once its step is
  // done); a bring on demand of a busy unit is refused.
  void set_home_busy(int unit, bool busy) { schedule_.set_home_busy(unit, busy); }
  // Where copies home are queued: a host step waits there for its gradients.
  c10::cuda::CUDAStream home_stream() const { return home_stream_; }
  // In a backward whose gradients go home unwaited for (a host step): the
  // host waits, oldest first, while more than `bytes` of copies home are
  // under way (core/home_copies.h).
  void limit_copies_home(std::size_t bytes) { homes_.at_most(bytes); }
  // A step in backward was queued on the current stream (its own), its
  // gradients let go after it; then the host waits, oldest first, while
  // more than `steps_behind` such steps are under way, so that the
  // gradients whose memory waits for their step are at most those
  // (core/steps_behind.h). One call: one crossing per unit.
  void step_queued(std::size_t steps_behind);
  // How many times the backward waited so (tests, stats).
  std::size_t waits_for_steps() const { return steps_behind_.waits(); }
  // The bytes from beside the arena whose copies home are under way.
  std::size_t copies_home_under_way() {
    homes_.reap();
    return homes_.beside_under_way();
  }
  // Everything leaves the GPU, resident units included (undo); after this,
  // nothing is planned.
  void evict_all();

  // How many of the unit's bytes are in slots now (tests, stats).
  std::size_t bytes_on_gpu(int unit) const;
  // The units holding slots now, by why: running, brought ahead, resident
  // (in budget errors and tests).
  std::string holders() const;
  // The units brought ahead that have not run yet.
  const std::vector<int>& staged() const { return schedule_.staged(); }
  // How many tensors it streams (weights, and gradients and states it took).
  std::size_t streamed_tensors() const { return entries_.size(); }
  int units() const { return static_cast<int>(units_.size()); }
  std::size_t unit_bytes(int unit) const;

  // Threading: the executor is one thread's at a time. Its calls come from
  // the caller's thread and autograd's device thread; each holds this lock
  // for the whole call (the Python bindings take it with the GIL released,
  // so a wait on the GPU inside holds no other Python thread: a host step's
  // worker runs on meanwhile). The rule that keeps this free of deadlock:
  // nothing waits for this lock (or for a lock a call holds) while holding
  // the GIL, since a call may take the GIL itself (in torch 2.14, a tensor
  // with a Python object whose count changes between 1 and 2 takes it).
  std::mutex& calls_lock() { return calls_lock_; }

 private:
  std::mutex calls_lock_;
  struct Entry {
    std::unique_ptr<StreamedTensor> tensor;
    std::string name;     // in traces: its submodule's, or "<submodule>.grad"
    int holds = 0;        // passes and steps using it now: never evicted
    bool pinned = false;  // a resident unit's
    // A buffer: a forward may write it without moving its version (the
    // batch_norm kernels write running_mean and running_var so), so once
    // its unit ran while it sat in its slot, the budget marks it written
    // (note_ran), and it goes home when it leaves.
    bool buffer = false;
    // A buffer its unit's run read in place, from its home, and may have
    // written there on the compute stream (ran_at_home): a bring of it
    // waits for the compute streams first.
    bool written_at_home = false;
    // The compute streams its slot was used on since it arrived (a step may
    // run on a stream of its own): what it leaves after.
    std::vector<c10::cuda::CUDAStream> used_on;
  };
  struct Unit {
    std::string name;
    std::vector<int> tensors;
    std::vector<at::Tensor> trainable;
    std::vector<int> grads;  // per trainable parameter, -1 until it had one
    // every parameter whose gradient it streamed -> that gradient's entry
    // (kept while the parameter is frozen: unfrozen, it has its home again)
    std::unordered_map<const c10::TensorImpl*, int> grad_ids;
  };

  c10::cuda::CUDAStream compute() const;
  void note_use(const std::vector<int>& ids);  // the current stream uses their slots
  // Their unit runs, from their slots (note_ran) or reading their homes in
  // place (ran_at_home): its buffers may be written.
  void note_ran(const std::vector<int>& ids);
  void ran_at_home(const std::vector<int>& ids);
  // An entry's streams, and the current one (the caller's next work).
  std::vector<c10::cuda::CUDAStream> streams_of(int id) const;
  // compute_done_: the work so far of the current stream and of every
  // stream the slots of `ids` were used on.
  void record_done(const std::vector<int>& ids);
  // The entry's target died: its slot goes back once its streams passed.
  void abandon(int id);
  std::uintptr_t key(int id) const {
    return reinterpret_cast<std::uintptr_t>(entries_[id].tensor.get());
  }
  int entry_for(const at::Tensor& t) const;  // -1 if unknown
  int add_entry(const at::Tensor& target, StreamedTensor::Memory memory, std::string name);
  void hold(int id);
  void release(int id);
  // Admits and brings `ids` on `stream` (one ready event), holding each.
  // `optional` (brought ahead): not when the arena has no room for them
  // (false: nothing held, nothing counted). Otherwise slots without room
  // are drawn beside it (counted: arena_misses). `if_free` (beyond the
  // window, optional too): only into room nothing holds, in the books and
  // the arena; nothing leaves for them. `copying`: called with the bytes
  // about to cross just before their copies are queued, and only then
  // (not when all of `ids` are on the GPU already, nor when refused): where
  // a bring's trace range begins, so that a trace's bytes are what moved.
  bool bring_entries(const std::vector<int>& ids, c10::cuda::CUDAStream stream,
                     bool optional = false, bool if_free = false,
                     const std::function<void(std::size_t)>& copying = nullptr);
  void wait_ready(const std::vector<int>& ids);
  void carry_out(const std::vector<EvictionStep>& steps);
  // `ids` leave now, counted as evictions by how they leave (written ones go
  // home by a copy); held, pinned or absent ones stay.
  void evict_now(const std::vector<int>& ids);
  // What a batch of departures wrote home: its bytes, and those of them
  // from memory beside the arena (gradients: HomeCopies::at_most).
  struct Wrote {
    std::size_t bytes = 0;
    std::size_t beside = 0;
  };
  // Leaves now: written home if the budget or its version says so (the
  // caller recorded compute_done_ for it), counted in `wrote`.
  void leave(int id, bool written, Wrote& wrote);
  // The units' tensors stop being held (the schedule let go of them).
  void release_units(const std::vector<int>& units);
  // For a bring that must happen now and finds the budget held: units
  // brought ahead, and units whose backward is under way (if their weights
  // leave, their kernels read them in place in their home: weights are
  // not written in backward), stop holding. Returns whether any did.
  bool let_go_of_what_can_wait();
  // Admits `id` (the budget's evictions to carry out); `required`: when the
  // budget is held, lets go of what can wait and tries once more, and names
  // who holds it if it still does not fit.
  std::vector<EvictionStep> admit(int id, bool required);
  // The resident units an order gives with a window.
  ResidentPlan plan_for(const std::vector<int>& order, std::size_t per_streamed,
                        std::size_t per_any) const;
  std::size_t new_grad_bytes(const Unit& u) const;  // its parameters without a gradient
  static std::size_t storage_bytes(const std::vector<at::Tensor>& tensors);
  // The name of the first of `tensors` it streams ("optimizer" if none):
  // states a step makes or loads are named after it.
  std::string owner_of(const std::vector<at::Tensor>& tensors) const;
  void adopt(int id);

  ResidencyBudget& budget_;
  ShareId share_;
  c10::Device device_;
  UnitSchedule schedule_;
  std::vector<Entry> entries_;
  std::unordered_map<const c10::TensorImpl*, int> by_target_;
  std::unordered_map<std::uintptr_t, int> by_key_;
  std::vector<Unit> units_;
  std::vector<int> step_held_;  // held by bring() until step_done()
  c10::cuda::CUDAStream bring_stream_;
  c10::cuda::CUDAStream home_stream_;
  // Copies home under way, and the waits for them (core/home_copies.h).
  HomeCopies homes_;
  StepsBehind steps_behind_;
  // Before work that makes `bytes` on the GPU.
  void room_for(std::size_t bytes);
  // Where brought slots come from: one range the size of the budget, or of
  // all the share could hold if that is less (slot_memory.h), drawn at the
  // first bring and let go with evict_all.
  std::shared_ptr<SlotArenaMemory> arena_;
  std::size_t arena_bytes(std::size_t budget) const;
  std::vector<c10::Storage> arena_slots(const std::vector<std::size_t>& sizes);
  StreamsPassed compute_done_;  // the compute streams' work before a batch of evictions
  RuntimeEvent step_inputs_;    // the compute stream's work when optimizer.step() began
};

}  // namespace torch_uvm

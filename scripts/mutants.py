"""Break the code a GPU test guards and check that the test fails.

    python3 scripts/mutants.py [--out DIR] [NAME ...]

Each mutant below replaces one piece of the torch glue, rebuilds the
extension (ninja recompiles the one file; a Python mutant needs none), runs
the tests that guard it and expects them to fail. The source is restored, and the extension rebuilt,
whatever happens. Run it on the GPU machine after a build
(scripts/gpu_session.sh build); it prints a table and exits non-zero if a
mutant survives.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIES = "tests/python/test_gpu_copies.py::"
OFFLOAD = "tests/python/test_gpu_offload.py::"
PROFILE = "tests/python/test_gpu_profile.py::"
LOOPS = "tests/python/test_gpu_training_loops.py::"

# (name, file, text, replacement, tests that must fail). A test named
# "core:Suite.Test" is a GoogleTest of the host-runtime build (build/core_tests,
# rebuilt by cmake): those mutants run on any machine.
MUTANTS = [
    ("copy to a GPU does not prefetch its source", "csrc/torch/copy_kernels.cpp",
     "    schedule_prefetch(ptr, bytes, to_index(target), stream, /*off_thread=*/false);\n", "",
     [COPIES + "test_copy_to_gpu_prefetches_the_managed_source",
      COPIES + "test_load_state_dict_from_managed_cpu_tensors"]),
    ("a blocking copy to a GPU does not wait", "csrc/torch/copy_kernels.cpp",
     "  if (!non_blocking) c10::cuda::getCurrentCUDAStream(target.index()).synchronize();\n", "",
     [COPIES + "test_a_blocking_copy_is_done_when_it_returns"]),
    ("overlapping copies take the fast path", "csrc/torch/copy_kernels.cpp",
     "  return x < y + nb && y < x + na;", "  return false;",
     [COPIES + "test_copies_over_memory_the_destination_shares_are_pytorchs"]),
    ("no 4 MiB floor", "csrc/torch/copy_kernels.cpp",
     "constexpr std::size_t kFastCopyMinBytes = 4u << 20;",
     "constexpr std::size_t kFastCopyMinBytes = 1;",
     [COPIES + "test_load_state_dict_from_managed_cpu_tensors",
      COPIES + "test_small_and_unmanaged_copies_to_cpu_are_pytorchs"]),
    ("the budget is ignored by copies", "csrc/torch/copy_kernels.cpp",
     "  if (!residency_budget().has_budget(self.device().index())) return true;\n",
     "  return true;\n",
     [COPIES + "test_under_a_budget_a_cpu_homed_destination_is_not_prefetched_into"]),
    ("every CPU-homed destination is refused", "csrc/torch/copy_kernels.cpp",
     "  if (!residency_budget().has_budget(self.device().index())) return true;\n", "",
     [COPIES + "test_a_moved_cpu_tensor_is_a_destination_like_any_other",
      COPIES + "test_load_state_dict_from_managed_cpu_tensors"]),
    ("copies to the CPU are not staged", "csrc/torch/copy_kernels.cpp",
     "  if (stages(self, src)) {", "  if (false && stages(self, src)) {",
     [COPIES + "test_copy_to_managed_cpu_goes_through_pinned_buffers"]),
    ("residency_limit_mb is not applied in C++", "csrc/torch/state.cpp",
     "b->set_limit(d, limit);", "(void)b;",
     [OFFLOAD + "test_environment_keys_for_larger_than_gpu"]),
    # the streaming engine (issue 20)
    ("streamed submodules are not brought ahead", "csrc/torch/stream_executor.cpp",
     "    if (!bring_entries(v.tensors, bring_stream_, /*optional=*/true)) break;\n    v.staged = true;\n",
     "    continue;\n",
     [OFFLOAD + "test_streamed_weights_are_copied_into_gpu_memory_ahead_of_their_use"]),
    ("a brought tensor keeps reading its home", "csrc/torch/streamed_tensor.cpp",
     "  point_at(target_, slot_);\n  version_ = version();\n}\n\nvoid StreamedTensor::adopt",
     "  version_ = version();\n}\n\nvoid StreamedTensor::adopt",
     [OFFLOAD + "test_offloaded_model_matches_all_resident_within_its_budget",
      OFFLOAD + "test_streamed_weights_are_copied_into_gpu_memory_ahead_of_their_use"]),
    ("a written slot is not copied home", "csrc/torch/streamed_tensor.cpp",
     "    copy_bytes(home_.mutable_data(), slot_.data(), nbytes_, target_.device(), home_stream,",
     "    if (false) copy_bytes(home_.mutable_data(), slot_.data(), nbytes_, target_.device(), "
     "home_stream,",
     [OFFLOAD + "test_training_under_a_budget_gives_the_all_resident_losses"]),
    ("shares take from each other's budget", "csrc/torch/stream_executor.cpp",
     "      return budget_.admit(device_.index(), key(id), bytes, false, share_);",
     "      return budget_.admit(device_.index(), key(id), bytes, false);",
     [OFFLOAD + "test_each_offload_streams_within_its_own_share_whatever_the_order"]),
    ("complete gradients stay on the GPU", "torch_uvm/offload_training.py",
     "        executor.grads_ready(unit.index, True)\n        return\n",
     "        executor.grads_ready(unit.index, False)\n        return\n",
     [OFFLOAD + "test_training_under_a_budget_gives_the_all_resident_losses"]),
    ("step_in_backward does not step in backward", "torch_uvm/offload_training.py",
     "    if not handle.step_in_backward or not handle._optimizers:",
     "    if True:",
     [OFFLOAD + "test_training_under_a_budget_gives_the_all_resident_losses",
      OFFLOAD + "test_step_in_backward_refuses_a_second_backward_before_the_step"]),
    ("the step in backward runs on the compute stream", "torch_uvm/offload_training.py",
     "    with torch.cuda.stream(state.step_stream):",
     "    with torch.cuda.stream(torch.cuda.current_stream(handle.device)):",
     [OFFLOAD + "test_training_under_a_budget_gives_the_all_resident_losses"]),
    ("inference keeps a resident prefix", "csrc/torch/stream_executor.cpp",
     "training_ ? ResidentAt::kStart : ResidentAt::kEnd", "ResidentAt::kStart",
     [OFFLOAD + "test_offload_in_place_reads_streamed_weights_where_they_are",
      OFFLOAD + "test_offloaded_model_matches_all_resident_within_its_budget"]),
    ("a slot waits for the host to see its streams pass", "csrc/torch/streamed_tensor.cpp",
     "  if (slot_stream_) {", "  if (false) {",
     [OFFLOAD + "test_streaming_holds_no_more_gpu_memory_than_its_budget_while_the_host_runs_ahead"]),
    ("a bring draws a slot while copies home hold the share over its budget",
     "csrc/torch/stream_executor.cpp",
     "  while (!homes_pending_.empty() && budget_.excess(device_.index(), share_, extra) > 0) {",
     "  while (false) {",
     [OFFLOAD + "test_training_holds_no_more_gpu_memory_than_its_budget_while_copies_go_home"]),
    ("slots come from PyTorch's allocator, beside the share's arena", "csrc/torch/stream_executor.cpp",
     "    std::vector<c10::Storage> slots = arena_slots(sizes);",
     "    std::vector<c10::Storage> slots;",
     [OFFLOAD + "test_slots_of_mixed_sizes_hold_no_more_gpu_memory_than_the_budget"]),
    ("a unit is brought ahead where the arena has no room for it", "csrc/torch/stream_executor.cpp",
     "      if (optional) {  // not now", "      if (false) {  // not now",
     [OFFLOAD + "test_slots_of_mixed_sizes_hold_no_more_gpu_memory_than_the_budget"]),
    ("an arena's slot freed after another stream used it is reused at once", "csrc/core/slot_arena.cpp",
     "  if (block->stream_uses.empty() || pending_.defer(block)) return_to_pool(block);",
     "  return_to_pool(block);",
     ["core:SlotArenaTest.ASlotAnotherStreamUsedIsReusedOnlyOnceThatStreamPassed"]),
    ("a failed placement moves the arena's cursor", "csrc/core/slot_arena.cpp",
     "    cursor_ = cursor;", "    (void)cursor;",
     ["core:SlotArenaTest.SlotsDrawnTogetherAllFindRoomOrNoneIsTaken"]),
    ("an arena's freed neighbours stay apart", "csrc/core/slot_arena.cpp",
     "  coalesce_block(block);", "  (void)block;",
     ["core:SlotArenaTest.MixedSizesReuseTheOneRangeCoalescedAnywhere"]),
    ("an inference arena makes room for gradients and states", "csrc/torch/stream_executor.cpp",
     "      all += training_ ? (1 + kStatesPerParameter) * SlotArena::block_bytes(p.storage().nbytes())\n                       : 0;",
     "      all += (1 + kStatesPerParameter) * SlotArena::block_bytes(p.storage().nbytes());",
     [OFFLOAD + "test_an_inference_arena_is_the_weights_when_the_budget_holds_them"]),
    ("auto reads small inputs in place whatever the window costs", "torch_uvm/offload.py",
     'return "prefetch" if prefetch_bytes * IN_PLACE_SPEED < in_place_bytes else "in_place"',
     'return "in_place"',
     [OFFLOAD + "test_offload_mode_auto_prefetches_small_inputs_when_its_window_costs_little"]),
    ("what leaves waits for the current stream's work only", "csrc/torch/stream_executor.cpp",
     "    for (const auto& s : entries_[id].used_on) {",
     "    for (const auto& s : std::vector<c10::cuda::CUDAStream>{}) {",
     [OFFLOAD + "test_weights_a_step_wrote_on_a_stream_of_its_own_go_home_after_it"]),
    ("the window is sized by the largest unit", "csrc/torch/stream_executor.cpp",
     "Window{per_streamed, per_any * largest_trainable()},",
     "Window{0, (per_streamed + per_any) * [&] { std::size_t m = 0; for (int u = 0; u < units(); "
     "++u) m = std::max(m, unit_bytes(u)); return m; }()},",
     [OFFLOAD + "test_a_resident_tied_embedding_streams_the_rest_through_a_smaller_window"]),
    ("slots are managed memory", "csrc/torch/slot_memory.cpp",
     "    memory = native()->allocate(bytes);", "    memory = cca::get()->allocate(bytes);",
     [OFFLOAD + "test_offloaded_model_matches_all_resident_within_its_budget"]),
    ("a dropped offload keeps its share", "torch_uvm/offload.py",
     "weakref.finalize(self, _end_lease, lease)", "weakref.finalize(self, len, [lease])",
     [OFFLOAD + "test_an_offload_dropped_without_undo_gives_back_what_it_held"]),
    ("gradient hooks hold the offload strongly", "torch_uvm/offload_training.py",
     "lambda p, ref=ref, i=i: _on_grad(ref, i)",
     "lambda p, h=handle, i=i: _on_grad(lambda: h, i)",
     [OFFLOAD + "test_an_offload_dropped_without_undo_gives_back_what_it_held"]),
    ("offload does not collect a dropped offload before refusing", "torch_uvm/residency.py",
     "    except ValueError:\n        gc.collect()\n        share = attempt()",
     "    except ValueError:\n        raise",
     [OFFLOAD + "test_an_offload_dropped_without_undo_gives_back_what_it_held"]),
    # every training loop users write (issue 33)
    ("an evaluation first keeps its inference plan for training", "torch_uvm/offload.py",
     "                    not self.training or executor.largest_trainable() > self._planned_step):",
     "                    False or executor.largest_trainable() > self._planned_step):",
     [LOOPS + "test_an_evaluation_first_then_training_gives_the_all_resident_losses"]),
    ("units brought ahead that a pass skipped keep holding", "csrc/torch/stream_executor.cpp",
     "  if (planned_) let_go_of_passed(unit, backward);\n", "",
     [LOOPS + "test_inference_with_routing_that_changes_each_pass_stays_within_its_budget"]),
    ("a training pass's end keeps what it brought ahead", "csrc/torch/stream_executor.cpp",
     "    if (u.staged && (u.staged_backward || training_)) unstage(u);",
     "    if (u.staged && u.staged_backward) unstage(u);",
     [LOOPS + "test_experts_not_routed_to_let_go_of_what_was_brought_for_them"]),
    ("a bring that must happen never lets go of what can wait", "csrc/torch/stream_executor.cpp",
     "      if (again || !let_go_of_what_can_wait()) {", "      if (true) {",
     [LOOPS + "test_units_whose_gradients_never_all_arrive_let_go_when_a_bring_needs_room"]),
    ("frozen parameters need a step's room (the least budget)", "torch_uvm/offload.py",
     "        trainable = max(u.trainable_bytes for u in self.units)",
     "        trainable = max(u.nbytes for u in self.units)",
     [LOOPS + "test_a_frozen_base_trains_in_a_budget_near_its_inference_budget"]),
    ("frozen parameters need a step's room (the plan)", "csrc/torch/stream_executor.cpp",
     "    for (const at::Tensor& p : u.trainable) sum += p.storage().nbytes();\n",
     "    sum = unit_bytes(static_cast<int>(&u - units_.data()));\n",
     [LOOPS + "test_a_frozen_base_keeps_more_of_itself_resident"]),
    ("requires_grad is read once, at offload", "torch_uvm/offload.py",
     "        if training:\n            offload_training.follow_trainable(self)\n", "",
     [LOOPS + "test_parameters_unfrozen_between_steps_train_from_then_on"]),
    ("a closure is not run", "torch_uvm/offload_training.py",
     "        with torch.enable_grad():\n            return closure()",
     "        with torch.enable_grad():\n            return None",
     [LOOPS + "test_step_runs_the_closure_and_returns_its_loss"]),
    ("loaded states land on the GPU", "torch_uvm/offload_training.py",
     "    handle._handles.append(optimizer.register_load_state_dict_pre_hook(to_homes))", "",
     [LOOPS + "test_loaded_optimizer_states_go_to_their_homes"]),
    ("parameters that are not offloaded are not stepped", "torch_uvm/offload_training.py",
     "        if plain:\n            _own_step(optimizer, original_step, plain, kwargs)\n    finally:",
     "    finally:",
     [LOOPS + "test_parameters_that_are_not_offloaded_step_as_they_are"]),
    ("an arena is the weights' bytes, not their blocks", "csrc/torch/stream_executor.cpp",
     "  for (const Entry& e : entries_) all += SlotArena::block_bytes(e.tensor->nbytes());",
     "  for (const Entry& e : entries_) all += e.tensor->nbytes();",
     [LOOPS + "test_an_arena_holds_many_small_tensors_at_its_rounding"]),
    ("a move to the CPU converts streamed tensors in place", "torch_uvm/offload.py",
     "            if probe.device.type == \"cpu\" and probe.dtype == probe_of.dtype:\n                handle.undo()",
     "            if False:\n                handle.undo()",
     [LOOPS + "test_moving_an_offloaded_module_to_the_cpu_undoes_the_offload"]),
    ("a parameter unfrozen again gets a new gradient home", "csrc/torch/stream_executor.cpp",
     "    const auto it = u.grad_ids.find(p.unsafeGetTensorImpl());\n"
     "    grads.push_back(it == u.grad_ids.end() ? -1 : it->second);",
     "    grads.push_back(-1);",
     [LOOPS + "test_freezing_and_unfreezing_every_step_reuses_each_gradients_home"]),
    ("a backward that raised is never ended", "torch_uvm/offload.py",
     "            offload_training.end_failed_backward(self)\n", "",
     [LOOPS + "test_a_backward_that_raises_half_way_is_ended_before_the_next_forward"]),
    ("a forward with grad plans for training without an optimizer", "torch_uvm/offload.py",
     "            if training and self._optimizers and (", "            if training and (",
     [LOOPS + "test_a_forward_with_grad_and_no_optimizer_keeps_an_inference_plan"]),
    ("a conversion that is not a move passes", "torch_uvm/offload.py",
     "            elif any(fn(t) is not t for t in unit.targets):", "            elif False:",
     [LOOPS + "test_a_memory_format_change_of_an_offloaded_module_is_refused"]),
    # the policy (core/residency), on the host runtime
    ("a share past the ceiling is opened", "csrc/core/residency.cpp",
     "  TORCH_UVM_CHECK_ARG(taken + bytes <= bound,", "  TORCH_UVM_CHECK_ARG(true,",
     ["core:Residency.ASharePastTheLimitOrTheCeilingIsRefusedNamingTheHolders"]),
    ("a limit below the shares is taken", "csrc/core/residency.cpp",
     "    TORCH_UVM_CHECK_ARG(*bytes >= taken,", "    TORCH_UVM_CHECK_ARG(true,",
     ["core:Residency.ASharePastTheLimitOrTheCeilingIsRefusedNamingTheHolders"]),
    ("closing a share keeps its ranges", "csrc/core/residency.cpp",
     "  while (!it->second.lru.empty()) erase(it->second.lru.begin(), ResidencyEvent::kForget);\n", "",
     ["core:Residency.EachShareIsItsOwnBudgetWhateverTheOrder"]),
    ("memory made on the GPU counts as brought", "csrc/core/residency.cpp",
     "    if (arrives) st->prefetched_bytes += bytes;", "    st->prefetched_bytes += bytes;",
     ["core:Residency.DeadRangesAreDiscardedAndCounted"]),
    ("copies home under way make no room", "csrc/core/residency.cpp",
     "       it != s.lru.end() && held(s) + bytes > budget;) {",
     "       it != s.lru.end() && s.stats.resident_bytes + bytes > budget;) {",
     ["core:Residency.CopiesHomeUnderWayCountUntilTheyPass"]),
    ("an arrival is held beside the copies home it waits for", "csrc/core/residency.cpp",
     "    if (budget && over > *budget) waits", "    if (false) waits",
     ["core:Residency.CopiesHomeUnderWayCountUntilTheyPass"]),
    ("memory made on the GPU is not held beside what it evicts", "csrc/core/residency.cpp",
     "beside += e.how == Eviction::kWriteHome ? e.bytes : 0;", "beside += 0 * e.bytes;",
     ["core:Residency.MemoryMadeOnTheGpuIsHeldBesideTheWrittenRangesItEvicts"]),
    ("the host waits for copies home that cannot make room", "csrc/core/residency.cpp",
     "  return over - *budget <= s.stats.leaving_bytes ? over - *budget : 0;",
     "  return over - *budget;",
     ["core:Residency.ExcessIsWhatCopiesHomePassingCanFree"]),
    ("no room is made for memory about to be made", "csrc/core/residency.cpp",
     "  if (const auto budget = budget_of(s)) evict_for(s, bytes, *budget, steps);\n  return steps;",
     "  return steps;",
     ["core:Residency.RoomIsMadeForMemoryAboutToBeMade"]),
    ("a backward makes its gradients without room", "csrc/torch/stream_executor.cpp",
     "  if (backward) room_for(new_grad_bytes(u), unit);", "",
     [OFFLOAD + "test_training_holds_no_more_gpu_memory_than_its_budget_while_copies_go_home"]),
    ("an optimizer without states gets room for first states at every step",
     "torch_uvm/offload_training.py",
     "if id(p) not in stepped and not optimizer.state.get(p))", "if not optimizer.state.get(p))",
     ["tests/python/test_offload_steps.py::test_room_for_first_states_is_asked_once_per_parameter"]),
    ("a first step makes its states without room", "csrc/torch/stream_executor.cpp",
     "    room_for(new_bytes);  // after", "    (void)new_bytes;  // after",
     [OFFLOAD + "test_training_holds_no_more_gpu_memory_than_its_budget_while_copies_go_home"]),
    ("copies home under way are not in the peak", "csrc/core/residency.cpp",
     "        st->peak_resident_bytes, st->resident_bytes + st->leaving_bytes + beside - waits);",
     "        st->peak_resident_bytes, st->resident_bytes);",
     ["core:Residency.CopiesHomeUnderWayCountUntilTheyPass"]),
    ("the first run that fits wins, not the longest", "csrc/core/resident_plan.cpp",
     "    best = k;  // later runs", "    if (best == kNone) best = k;  // later runs",
     ["core:ResidentPlan.TheResidentPrefixOrSuffixIsWhatFitsBesideTheWindowInOrder"]),
    ("the resident suffix is a prefix", "csrc/core/resident_plan.cpp",
     "at == ResidentAt::kStart ? k : n - 1 - k;", "k;",
     ["core:ResidentPlan.TheResidentPrefixOrSuffixIsWhatFitsBesideTheWindowInOrder"]),
    ("the window is sized by the largest unit, streamed or not", "csrc/core/resident_plan.cpp",
     "(streamed > 0 ? window.per_streamed * streamed : 0)",
     "(streamed > 0 ? window.per_streamed * *std::max_element(piece_bytes.begin(), "
     "piece_bytes.end()) : 0)",
     ["core:ResidentPlan.TheWindowIsSizedByTheLargestUnitThatStreams",
      "core:ResidentPlan.ATiedPieceCountsOnceAndStreamsWithNoUnitWhenResident"]),
    ("all fits without a step's room", "csrc/core/resident_plan.cpp",
     "  const std::size_t step = window.step_bytes;", "  const std::size_t step = 0;",
     ["core:ResidentPlan.TheWindowIsSizedByTheLargestUnitThatStreams"]),
    ("a tied piece counts once per unit", "csrc/core/resident_plan.cpp",
     "    if (taken[p] || std::find(", "    if (std::find(",
     ["core:ResidentPlan.ATiedPieceCountsOnceAndStreamsWithNoUnitWhenResident"]),
    ("an arrival is not in the timeline", "csrc/core/residency.cpp",
     "  note(*where_[address], arrives ? ResidencyEvent::kArrive : ResidencyEvent::kAdopt);\n", "",
     ["core:Residency.ATimelineRecordsEveryArrivalAndDepartureInOrder"]),
    ("a departure is not in the timeline", "csrc/core/residency.cpp",
     "  note(*it, why);\n", "",
     ["core:Residency.ATimelineRecordsEveryArrivalAndDepartureInOrder"]),
    ("a slot does not release the pool's cache first", "csrc/core/caching_managed_allocator.cpp",
     "    if (captures_underway_ == 0) release_cached(/*keep=*/0, lock);\n  }\n  if (!fits())",
     "  }\n  if (!fits())",
     ["core:*/AllocatorTest.GpuMemoryHeldOutsideThePoolCountsAgainstTheCap/*"]),
    ("GPU memory outside the pool is not counted", "csrc/core/caching_managed_allocator.cpp",
     "  outside_ += bytes;\n", "",
     ["core:*/AllocatorTest.GpuMemoryHeldOutsideThePoolCountsAgainstTheCap/*"]),
    # the driver's counters (issue 22): a prefetch never changes data, so these
    # tests see it through the counters
    ("a prefetch is not issued", "torch_uvm/__init__.py",
     "    _C.prefetch(tensor, _device(device), stream)\n", "    pass\n",
     [PROFILE + "test_a_prefetched_tensor_is_read_without_faults_and_the_prefetch_is_counted",
      PROFILE + "test_expect_no_gpu_faults_passes_a_prefetched_read_and_fails_a_missing_prefetch"]),
    ("a move to a GPU does not prefetch", "csrc/torch/move_kernels.cpp",
     "    schedule_prefetch(ptr, bytes, to_index(target), stream,\n"
     "                      /*off_thread=*/self.device().is_cpu() && non_blocking);",
     "    (void)stream;",
     [PROFILE + "test_a_move_to_the_gpu_is_read_without_faults"]),
    ("prefetching does not prefetch its batches", "torch_uvm/residency.py",
     "                _C.prefetch(r.tensor, device, stream)\n            r.device = device",
     "                pass\n            r.device = device",
     [PROFILE + "test_the_accounting_of_streamed_batches_matches_what_the_driver_moved"]),
    ("counters are taken from a running torch.profiler", "torch_uvm/profile.py",
     "        if _torch_profiler_recording():\n            why = (",
     "        if False:\n            why = (",
     [PROFILE + "test_counters_are_not_taken_from_a_running_torch_profiler"]),
    ("a trace leaves the driver's events out", "torch_uvm/profile.py",
     "        ours += self._driver_trace(offset_us)", "        pass",
     [PROFILE + "test_a_trace_and_a_plot_show_the_driver_events"]),
    ("the compute stream reads a gradient before its copy home lands",
     "csrc/torch/stream_executor.cpp", "    homes_written_.block(stream_ref(compute()));\n  }\n  after(unit);",
     "  }\n  after(unit);",
     [OFFLOAD + "test_a_gradient_read_right_after_it_went_home_is_the_gradient"]),
    ("a bring does not wait for writes at home", "csrc/torch/stream_executor.cpp",
     "    if (entries_[id].tensor->written_at_home()) {", "    if (false) {",
     [OFFLOAD + "test_a_forward_brings_weights_written_at_home_after_the_write"]),
    ("a step's bring does not wait for what came before the step", "csrc/torch/stream_executor.cpp",
     "  step_inputs_.block(stream_ref(bring_stream_));", "",
     [OFFLOAD + "test_a_step_reads_gradients_written_at_home_by_the_compute_stream[data]"]),
    # torch_uvm's own work in torch.profiler traces (issue 22, point 1)
    ("the policy's brings and evictions are not traced", "torch_uvm/residency.py",
     "    if not _torch_profiler_recording():\n        return contextlib.nullcontext()",
     "    return contextlib.nullcontext()",
     [PROFILE + "test_torch_uvms_own_work_is_named_in_a_torch_profiler_trace"]),
    ("a move is not traced", "csrc/torch/move_kernels.cpp",
     "  TraceScope scope(\"move\",", "  TraceScope scope(\"moved\",",
     [PROFILE + "test_torch_uvms_own_work_is_named_in_a_torch_profiler_trace"]),
]


def build(core=False):
    cmd = ["cmake", "--build", "build"] if core else \
        [sys.executable, "setup.py", "build_ext", "--inplace"]
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def run_tests(tests):
    """pytest, or the host-runtime GoogleTests for "core:" names: rc 1 = failed."""
    if tests[0].startswith("core:"):
        ran = subprocess.run([os.path.join(ROOT, "build", "core_tests"),
                              "--gtest_filter=" + ":".join(t[5:] for t in tests)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return (1 if ran.returncode != 0 else 0), ran.stdout
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *tests], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    return ran.returncode, ran.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="substrings of mutant names (default: all)")
    parser.add_argument("--out", default=None, help="folder for the log of each mutant")
    parser.add_argument("--core", action="store_true",
                        help="only the host-runtime mutants (no GPU needed; needs build/)")
    args = parser.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    chosen = [m for m in MUTANTS if (not args.names or any(n in m[0] for n in args.names))
              and (not args.core or m[4][0].startswith("core:"))]
    rows, survived = [], 0
    try:
        survived = run_all(chosen, args.out, rows)
    finally:   # whatever happened, what was built is built from the source again
        restored = build(core=args.core)
    print("\n| mutant | the tests that must kill it | outcome |\n|---|---|---|")
    for name, outcome, _, tests in rows:
        print(f"| {name} | {', '.join(t.split('::')[-1] for t in tests)} | {outcome} |")
    print(f"\n{len(rows) - survived} of {len(rows)} killed; rebuilt from the original "
          f"source: rc={restored.returncode}")
    return 1 if survived or restored.returncode else 0


def run_all(chosen, out, rows):
    survived = 0
    for name, path, text, replacement, tests in chosen:
        full = os.path.join(ROOT, path)
        original = open(full).read()
        if original.count(text) != 1:
            rows.append((name, "text not found once: fix the mutant", 0, tests))
            survived += 1
            continue
        # a killed run leaves the mutant on disk: `git checkout -- <file>` undoes it
        t0 = time.time()
        try:
            open(full, "w").write(original.replace(text, replacement))
            made = build(core=tests[0].startswith("core:"))
            if made.returncode != 0:
                outcome = "did not build"
                log = made.stdout
            else:
                rc, log = run_tests(tests)
                outcome = "killed" if rc == 1 else "SURVIVED" if rc == 0 else f"tests rc={rc}"
        finally:
            open(full, "w").write(original)
        survived += outcome != "killed"
        rows.append((name, outcome, time.time() - t0, tests))
        print(f"{outcome:>10}  {name}  ({time.time() - t0:.0f} s)", flush=True)
        if out:
            slug = "".join(c if c.isalnum() else "_" for c in name)[:60]
            with open(os.path.join(out, f"mutant_{slug}.log"), "w") as f:
                f.write(log)
    return survived


if __name__ == "__main__":
    sys.exit(main())

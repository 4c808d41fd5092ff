"""stream_trainer (torch_uvm/trainers.py) with a real Hugging Face Trainer
on the CPU and a stand-in offload: which optimizer it streams, when, how
often, and what it refuses before anything changes. The offload itself
streaming under a Trainer, against all-resident, is
examples/training/hf_trainer.py (test_gpu_examples.py)."""
import tempfile

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from torch_uvm import trainers  # noqa: E402


class Tiny(torch.nn.Module):
    """A model as the Trainer takes one: a loss from input_ids and labels."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.out = torch.nn.Linear(8, 16)

    def forward(self, input_ids, labels):
        logits = self.out(self.norm(self.embed(input_ids)))
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.arange(4) + i
        return {"input_ids": ids % 16, "labels": (ids + 1) % 16}


class StandIn:
    """What stream_trainer uses of an offload: its module, streams and
    stream_optimizer (recorded, with what the trainer held then)."""

    def __init__(self, module, trainer_of=None):
        self.module, self.calls, self.streamed = module, [], []
        self.trainer_of = trainer_of

    def streams(self, optimizer):
        return any(o is optimizer for o in self.streamed)

    def stream_optimizer(self, optimizer, **settings):
        trainer = self.trainer_of() if self.trainer_of else None
        self.calls.append((optimizer, settings, getattr(trainer, "lr_scheduler", None)))
        self.streamed.append(optimizer)
        return optimizer


def make(out, model=None, trainer_class=None, optimizers=(None, None), **settings):
    args = dict(output_dir=out, max_steps=2, per_device_train_batch_size=4, use_cpu=True,
                optim="adamw_torch", weight_decay=0.01, save_strategy="no", report_to=[],
                disable_tqdm=True, dataloader_num_workers=0)
    args.update(settings)
    cls = trainer_class or transformers.Trainer
    return cls(model=model or Tiny(), args=transformers.TrainingArguments(**args),
               train_dataset=Tokens(), optimizers=optimizers)


def test_the_optimizer_the_trainer_makes_is_streamed_once_before_its_scheduler():
    with tempfile.TemporaryDirectory() as out:
        trainer = make(out)
        handle = StandIn(trainer.model, lambda: trainer)
        assert handle.calls == [] and trainers.stream_trainer(handle, trainer,
                                                              host_step=0.5) is trainer
        assert handle.calls == []                 # nothing made yet: made by train()
        trainer.train()
        trainer.train()                           # a second train() makes none anew
    [(optimizer, settings, scheduler)] = handle.calls
    assert settings == {"host_step": 0.5}
    assert scheduler is None                       # streamed before the scheduler wraps step
    assert type(optimizer) is torch.optim.AdamW    # the torch optimizer, not accelerate's wrapper
    assert getattr(trainer.optimizer, "optimizer", trainer.optimizer) is optimizer
    decays = sorted(g["weight_decay"] for g in optimizer.param_groups)
    assert decays == [0.0, 0.01]                   # the Trainer's own groups (no decay on norms)


def test_an_optimizer_given_to_the_trainer_is_streamed_at_once():
    with tempfile.TemporaryDirectory() as out:
        model = Tiny()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = make(out, model, optimizers=(optimizer, None))
        handle = StandIn(model)
        trainers.stream_trainer(handle, trainer)
        assert [c[0] for c in handle.calls] == [optimizer]
        trainer.train()
    assert [c[0] for c in handle.calls] == [optimizer]


def test_a_subclass_makes_its_own_optimizer_and_that_one_is_streamed():
    made = []

    class Own(transformers.Trainer):
        def create_optimizer(self, model=None):
            if self.optimizer is None:
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
                made.append(self.optimizer)
            return self.optimizer
    with tempfile.TemporaryDirectory() as out:
        trainer = make(out, trainer_class=Own)
        handle = StandIn(trainer.model)
        trainers.stream_trainer(handle, trainer)
        trainer.train()
    assert [c[0] for c in handle.calls] == made and len(made) == 1


@pytest.mark.parametrize("settings, stream, match", [
    ({"max_grad_norm": 1.0}, {"step_in_backward": True}, "max_grad_norm=0"),
    ({"max_grad_norm": 0.0, "gradient_accumulation_steps": 2}, {"step_in_backward": True},
     "gradient_accumulation_steps=2"),
])
def test_settings_a_step_in_backward_cannot_keep_are_refused_before_anything_changes(
        settings, stream, match):
    with tempfile.TemporaryDirectory() as out:
        trainer = make(out, **settings)
        handle = StandIn(trainer.model)
        with pytest.raises(ValueError, match=match):
            trainers.stream_trainer(handle, trainer, **stream)
        assert trainer.create_optimizer.__func__ is transformers.Trainer.create_optimizer
        assert handle.calls == [] and not hasattr(trainer, trainers.MARK)


def test_another_model_a_second_call_and_a_non_trainer_are_refused():
    with tempfile.TemporaryDirectory() as out:
        trainer = make(out)
        with pytest.raises(ValueError, match="not and does not hold the offloaded"):
            trainers.stream_trainer(StandIn(Tiny()), trainer)
        assert trainer.create_optimizer.__func__ is transformers.Trainer.create_optimizer
        inner = StandIn(trainer.model.norm)           # an offloaded part of the trained model
        trainers.stream_trainer(inner, trainer)
        with pytest.raises(ValueError, match="streamed by an offload already"):
            trainers.stream_trainer(StandIn(trainer.model), trainer)
    for setting in ("deepspeed", "fsdp"):      # (set after: they need their libraries to be made)
        with tempfile.TemporaryDirectory() as out:
            trainer = make(out)
            setattr(trainer.args, setting, "full_shard")
            with pytest.raises(ValueError, match=f"TrainingArguments.{setting} is set"):
                trainers.stream_trainer(StandIn(trainer.model), trainer)
            assert not hasattr(trainer, trainers.MARK)
    with pytest.raises(TypeError, match="takes a Hugging Face transformers.Trainer"):
        trainers.stream_trainer(StandIn(Tiny()), object())


@pytest.mark.parametrize("change, stream, match", [
    (lambda t: setattr(t, "model_init", Tiny), {}, "has a model_init"),
    (lambda t: setattr(t.args, "fp16", True), {"step_in_backward": True}, "with fp16=True"),
    (lambda t: setattr(t.args, "optim", "adamw_torch_layerwise"), {},
     "steps inside gradient hooks"),
    (lambda t: setattr(t.args, "optim", "lomo"), {}, "steps inside gradient hooks"),
    (lambda t: t.train(), {}, "call stream_trainer before the first train"),
])
def test_trainers_whose_optimizer_would_escape_the_stream_are_refused(change, stream, match):
    """A model_init makes another model each train(); a loss scaler scales
    gradients a step in backward would use first; layer-wise optimizers
    step in hooks; after a train() accelerate holds the optimizer's step."""
    with tempfile.TemporaryDirectory() as out:
        trainer = make(out, max_grad_norm=0.0)
        change(trainer)
        handle = StandIn(trainer.model)
        with pytest.raises(ValueError, match=match):
            trainers.stream_trainer(handle, trainer, **stream)
        assert handle.calls == [] and not hasattr(trainer, trainers.MARK)


def test_an_optimizer_streamed_before_the_trainer_is_not_streamed_again():
    """The older pattern (stream_optimizer, then optimizers=(optimizer, None))
    followed by stream_trainer: one stream."""
    with tempfile.TemporaryDirectory() as out:
        model = Tiny()
        handle = StandIn(model)
        optimizer = handle.stream_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        trainer = make(out, model, optimizers=(optimizer, None))
        trainers.stream_trainer(handle, trainer)
        trainer.train()
    assert [c[0] for c in handle.calls] == [optimizer]

"""pipeline: pipeline parallelism on torch.distributed.pipelining, over all ranks (one stage per worker, no
data parallelism). The encoder's layers are cut into contiguous runs, as even as possible, one per stage;
stage 0 also holds the embeddings, the last stage the pooler and classifier (and computes the loss). Each
step's global batch is cut into microbatches that flow through the stages on the GPipe schedule (every
forward, then every backward) or 1F1B (one forward, one backward in the steady state: fewer activations
held). A stage waits while the pipeline fills and drains: the bubble, (stages - 1) / (microbatches +
stages - 1) of a step on either schedule.

Every rank sees the same batches (data_parallel_size 1), as under tensor; only the last stage holds the
loss and logits, so only it counts the metrics (reports_metrics).

Stages are built by hand from the whole Hugging Face model, not traced: each stage's module registers its
parts under the model's own names, so the one-file checkpoint holds the whole model with ddp's keys.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from trainer.config import ConfigError
from trainer.strategies import pipeline_microbatches, split_refusal
from trainer.strategies.base import OneDataShare, Strategy

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def layer_ranges(layers: int, stages: int) -> list[range]:
    """Contiguous runs of encoder layers, one per stage, as even as possible (earlier stages one more)."""
    size, extra = divmod(layers, stages)
    bounds = list(itertools.accumulate([size + (stage < extra) for stage in range(stages)], initial=0))
    return [range(start, end) for start, end in itertools.pairwise(bounds)]


class _Stage(torch.nn.Module):
    """One stage's share of a BertForSequenceClassification, its parts registered under the model's own
    names (bert.embeddings, bert.encoder.layer.<i>, bert.pooler, classifier), so its state_dict keys are
    the whole model's. forward(input_ids or hidden states, attention_mask): hidden states, or logits on
    the last stage."""

    def __init__(self, model: torch.nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        self.model_config, self.first, self.last = model.config, first, last
        self.base_name = model.base_model_prefix
        base, body = model.base_model, torch.nn.Module()
        if first:
            body.embeddings = base.embeddings
        body.encoder = torch.nn.Module()
        body.encoder.layer = torch.nn.ModuleDict({str(index): base.encoder.layer[index] for index in layers})
        if last:
            body.pooler = base.pooler
            self.dropout, self.classifier = model.dropout, model.classifier
        self.add_module(self.base_name, body)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        body = getattr(self, self.base_name)
        if self.first:
            hidden = body.embeddings(input_ids=hidden)
        # As BertModel.forward builds it from the embeddings' output (the same shape and dtype here).
        mask = create_bidirectional_mask(config=self.model_config, inputs_embeds=hidden,
                                         attention_mask=attention_mask)
        for layer in body.encoder.layer.values():
            hidden = layer(hidden, mask, None, encoder_attention_mask=None, past_key_values=None)
        if not self.last:
            # LayerNorm's output is fp32 under autocast too; the cast (a no-op then) pins the dtype the
            # next stage's receive buffer was made with.
            return hidden.float()
        # fp32 logits: the stage's declared output is fp32, and under bf16 autocast the classifier's matmul
        # gives bf16, which torch's stage refuses as a dtype mismatch (found on an H100 at one stage).
        return self.classifier(self.dropout(body.pooler(hidden))).float()


class PipelineParallel(OneDataShare, Strategy):
    supports_loss_scaling = False  # fp16's GradScaler would skip the step on one stage and not another

    @property
    def reports_metrics(self):
        return self.rank == self.world_size - 1  # the last stage holds the loss and logits

    def wrap_model(self, model, hooks):
        refusal = split_refusal(hooks.cfg, model.config.to_dict(), self.world_size)
        if refusal:
            raise ConfigError(refusal)
        cfg, layers = hooks.cfg, model.config.num_hidden_layers
        self.schedule_name = cfg.pipeline_schedule
        self.microbatches = pipeline_microbatches(cfg, self.world_size)
        first, last = self.rank == 0, self.rank == self.world_size - 1
        self.stage = _Stage(model, layer_ranges(layers, self.world_size)[self.rank], first, last)
        self.hidden_size = model.config.hidden_size
        # The whole model's parameter names, for the optimizer state in ddp's layout (build_optimizer).
        self.names = {id(parameter): name for name, parameter in model.named_parameters()}
        self.model_keys = list(model.state_dict())
        # The other stages' parameters are not this rank's to hold: free them (the model keeps their
        # names and shapes on the meta device).
        own = {id(parameter) for parameter in self.stage.parameters()}
        for module in model.modules():
            if (not any(True for _ in module.children()) and
                    not any(id(parameter) in own for parameter in module.parameters())):
                module.to("meta")
        self.names.update({id(parameter): name for name, parameter in model.named_parameters()})
        self.model = self.stage
        self.rows = 0  # the current step's batch rows: each microbatch's loss is divided by them
        self.schedule_for = None
        return self.stage

    def build_optimizer(self, optimizer_class, groups, **options):
        own = {id(parameter) for parameter in self.stage.parameters()}
        # ddp's optimizer numbers the parameters through the groups in order: the checkpoint keeps it.
        self.group_names = [[self.names[id(p)] for p in group["params"]] for group in groups]
        # name -> ddp's optimizer index (the whole state's numbering): full_state writes it, load reads it.
        every_name = itertools.chain.from_iterable(self.group_names)
        self.global_index = {name: i for i, name in enumerate(every_name)}
        local = [{**group, "params": [p for p in group["params"] if id(p) in own]} for group in groups]
        self.local_group_names = [[self.names[id(p)] for p in group["params"]] for group in local]
        return optimizer_class(local, **options)

    # --- a step ---
    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # A microbatch's summed loss over the whole batch's rows, and the schedule told not to scale the
        # gradients (scale_grads=False): the microbatches' gradients add up to the gradient of the batch's
        # mean loss, whatever the microbatches' sizes.
        return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum") / self.rows

    def _schedule(self, rows: int, width: int):
        """The schedule for a batch of rows x width: PipelineStage's receive buffers are made for one
        microbatch shape, so a batch of another shape (another padded width, the epoch's short last batch)
        gets a stage and schedule of its own (cheap: a one-integer vote between the stages)."""
        chunks = max(c for c in range(1, self.microbatches + 1) if rows % c == 0)
        key = (rows, width, chunks)
        if self.schedule_for != key:
            per_chunk = rows // chunks
            # requires_grad: the hidden states carry gradients back (a stage sends, or expects, one).
            hidden = torch.empty((per_chunk, width, self.hidden_size), device="meta", requires_grad=True)
            inputs = (torch.empty((per_chunk, width), dtype=torch.long, device="meta")
                      if self.stage.first else hidden)
            outputs = (torch.empty((per_chunk, self.stage.classifier.out_features), device="meta")
                       if self.stage.last else hidden)
            stage = PipelineStage(self.stage, self.rank, self.world_size, self.device,
                                  input_args=(inputs,), output_args=(outputs,))
            # A short last batch with fewer microbatches than stages runs on GPipe (1F1B refuses it); the
            # gradient is the same.
            name = self.schedule_name if chunks >= self.world_size else "gpipe"
            self.schedule = _SCHEDULES[name](stage, chunks, loss_fn=self._loss, scale_grads=False)
            self.schedule_for = key
        return self.schedule

    def forward_backward(self, batch, forward, backward, autocast):
        rows, width = batch["input_ids"].shape
        schedule = self._schedule(rows, width)
        self.rows = rows
        losses = []
        args = (batch["input_ids"],) if self.stage.first else ()
        # The attention mask reaches every stage as a keyword argument of each rank's own step(): every
        # rank holds the whole batch, and the schedule cuts keyword arguments into microbatches as it cuts
        # the inputs. Sending it between stages would need a second receive buffer per microbatch, and
        # torch's stages send only positional outputs.
        with autocast():
            schedule.step(*args, target=batch["labels"] if self.stage.last else None, losses=losses,
                          attention_mask=batch["attention_mask"])
        if self.stage.last:
            return torch.stack(losses).sum().detach()  # the batch's mean loss
        return torch.zeros((), device=self.device)  # not counted: reports_metrics is False here

    @torch.inference_mode()
    def logits(self, model, batch, autocast):
        """Validation: the whole batch passed stage to stage (no microbatches, no schedule)."""
        rows, width = batch["input_ids"].shape
        if self.stage.first:
            hidden = batch["input_ids"]
        else:
            hidden = torch.empty((rows, width, self.hidden_size), device=self.device)
            dist.recv(hidden, src=self.rank - 1)
        with autocast():
            output = model(hidden, batch["attention_mask"])
        if self.stage.last:
            return output
        dist.send(output.contiguous(), dst=self.rank + 1)
        return None

    # --- the whole state on rank 0, in ddp's layout ---
    def full_state(self, optimizer):
        local = optimizer.state_dict()
        local_names = list(itertools.chain.from_iterable(self.local_group_names))
        part = {
            "model": {key: value.detach().cpu() for key, value in self.stage.state_dict().items()},
            "state": {local_names[index]: {key: value.detach().cpu() if torch.is_tensor(value) else value
                                           for key, value in state.items()}
                      for index, state in local["state"].items()},
            "groups": [{key: value for key, value in group.items() if key != "params"}
                       for group in local["param_groups"]],
        }
        parts = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(part, parts, dst=0)
        if self.rank != 0:
            return None
        index = self.global_index
        model_state = {}
        for stage_part in parts:
            model_state.update(stage_part["model"])
        model_state = {key: model_state[key] for key in self.model_keys}
        state = {}
        for stage_part in parts:
            state.update({index[name]: value for name, value in stage_part["state"].items()})
        groups = [{**group, "params": [index[name] for name in names]}
                  for group, names in zip(parts[0]["groups"], self.group_names, strict=True)]
        return model_state, {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_full_state(self, model_state, optimizer_state, optimizer):
        self.stage.load_state_dict({key: model_state[key] for key in self.stage.state_dict()})
        index = self.global_index
        state, groups, local_index = {}, [], itertools.count()
        for group, names in zip(optimizer_state["param_groups"], self.local_group_names, strict=True):
            params = []
            for name in names:
                params.append(local := next(local_index))
                if index[name] in optimizer_state["state"]:
                    state[local] = optimizer_state["state"][index[name]]
            groups.append({**group, "params": params})
        optimizer.load_state_dict({"state": state, "param_groups": groups})

"""Optimizers and learning-rate schedules from a recipe's `train` section.

Weight decay lives in the optimizer, never in the model as L2 regularizers, and skips biases and normalization
parameters (variables named `bias`, `gamma`, `beta`): decaying BatchNorm scales toward zero hurts large-batch
training. Its meaning follows each optimizer's definition:

* `sgd` and `lars`: coupled L2, `gradient += weight_decay * w` before momentum (torch.optim.SGD, the ResNet papers,
  MLPerf LARS), so published values such as 1e-4 or 5e-4 carry over unchanged.
* `adamw` and `lamb`: decoupled, `w -= learning_rate * weight_decay * w` (Keras' AdamW/Lamb).

`build_optimizer` reads optional `TrainConfig` fields with `getattr(train, name, default)`, so it works with train
configs that predate them.
"""

from __future__ import annotations

import math

import keras
from keras import ops

# Variable names (regular expressions, matched with re.search) left out of weight decay and LARS adaptation.
NO_DECAY_NAMES = ("bias", "gamma", "beta")


def scaled_learning_rate(
    base_lr: float, global_batch_size: int, reference_batch_size: int
) -> float:
    """The linear scaling rule (Goyal et al., 2017): `base_lr * global_batch_size / reference_batch_size`.

    A recipe tuned at `reference_batch_size` keeps its per-example step size when run at another global batch
    size (say 256 on a GPU and 4096 on a TPU pod slice). Use it with a warmup for large ratios.

    Raises:
        ValueError: a batch size is not positive.
    """
    if global_batch_size < 1 or reference_batch_size < 1:
        raise ValueError(
            "scaled_learning_rate: batch sizes must be >= 1; received "
            f"global_batch_size={global_batch_size}, reference_batch_size={reference_batch_size}."
        )
    return base_lr * global_batch_size / reference_batch_size


def _warmup(peak: float, warmup_steps: int, step):
    """Linear warmup that reaches `peak` at the end of step `warmup_steps - 1` (never a zero first step)."""
    return peak * ops.minimum(1.0, (step + 1.0) / max(float(warmup_steps), 1.0))


@keras.saving.register_keras_serializable(package="tpukit")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak` over `warmup_steps`, then cosine (or constant) to `total_steps`.

    Args:
        peak: the learning rate after warmup.
        warmup_steps: steps of linear warmup (0: none).
        total_steps: the step where the cosine reaches 0.
        cosine: False keeps `peak` after the warmup.
    """

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, cosine: bool = True):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.cosine = cosine

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = _warmup(self.peak, self.warmup_steps, step)
        if not self.cosine:
            return warm if self.warmup_steps else ops.full_like(step, self.peak)
        decay_steps = max(self.total_steps - self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        cosine = 0.5 * self.peak * (1.0 + ops.cos(math.pi * progress))
        return ops.where(step < self.warmup_steps, warm, cosine)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "cosine": self.cosine,
        }


@keras.saving.register_keras_serializable(package="tpukit")
class WarmupStepDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak`, then `peak * decay_rate ** k` after the k-th of `boundaries` (the ResNet schedule).

    Args:
        peak: the learning rate after warmup.
        warmup_steps: steps of linear warmup (0: none).
        boundaries: increasing step numbers; the rate is multiplied by `decay_rate` from each of them on.
        decay_rate: the factor applied at each boundary.
    """

    def __init__(
        self,
        peak: float,
        warmup_steps: int,
        boundaries: tuple[int, ...] | list[int],
        decay_rate: float = 0.1,
    ):
        boundaries = [int(b) for b in boundaries]
        if boundaries != sorted(boundaries):
            raise ValueError(
                f"WarmupStepDecay: boundaries must increase; received boundaries={boundaries}."
            )
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.boundaries = boundaries
        self.decay_rate = decay_rate

    def __call__(self, step):
        step = ops.cast(step, "float32")
        passed = ops.zeros_like(step)
        for boundary in self.boundaries:
            passed = passed + ops.cast(step >= boundary, "float32")
        decayed = self.peak * ops.power(ops.cast(self.decay_rate, "float32"), passed)
        if not self.warmup_steps:
            return decayed
        return ops.where(
            step < self.warmup_steps, _warmup(self.peak, self.warmup_steps, step), decayed
        )

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "boundaries": list(self.boundaries),
            "decay_rate": self.decay_rate,
        }


@keras.saving.register_keras_serializable(package="tpukit")
class SGDWithL2(keras.optimizers.SGD):
    """Keras SGD (momentum, Nesterov) with coupled L2 weight decay: `gradient += weight_decay * w`.

    Keras' own `SGD(weight_decay=...)` decays decoupled (`w -= lr * wd * w`), which under momentum 0.9 is ten times
    weaker than the L2 penalty the published SGD recipes were tuned with; this class makes their values portable.

    Args:
        learning_rate: a float or a `LearningRateSchedule`.
        momentum: momentum in [0, 1].
        nesterov: use Nesterov momentum.
        weight_decay: L2 coefficient added to the gradient (0: none).
        exclude_names: variables whose name matches one of these regexes get no decay.
        **kwargs: other `keras.optimizers.Optimizer` arguments (`name`, `clipnorm`, ...).
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum: float = 0.9,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        exclude_names: tuple[str, ...] | list[str] | None = NO_DECAY_NAMES,
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate, momentum=float(momentum), nesterov=nesterov, **kwargs
        )
        self.l2 = float(weight_decay or 0.0)
        self.exclude_names = list(exclude_names or [])
        self.exclude_from_weight_decay(var_names=self.exclude_names)

    def update_step(self, gradient, variable, learning_rate):
        if self.l2 and self._use_weight_decay(variable):
            gradient = (
                ops.cast(gradient, variable.dtype) + ops.cast(self.l2, variable.dtype) * variable
            )
        super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        config = super().get_config()
        config.update({"weight_decay": self.l2, "exclude_names": self.exclude_names})
        return config


@keras.saving.register_keras_serializable(package="tpukit")
class LARS(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You, Gitman and Ginsburg, 2017) for large-batch training, in Keras 3.

    Follows the MLPerf / TF Model Garden LARS with classic momentum (tensorflow/models,
    `official/modeling/optimization/lars.py`, `LARS._resource_apply_dense`), per variable `w` with gradient `g`:

        g = g + weight_decay * w                                  (unless w is excluded)
        trust = trust_coefficient * ||w|| / ||g||                 (1 if excluded, or if ||w|| or ||g|| is 0)
        v = momentum * v + learning_rate * trust * g
        w = w - v                                                 (Nesterov: w - (momentum * v + lr * trust * g))

    Biases and normalization parameters (`exclude_names`) get neither weight decay nor adaptation, as in MLPerf's
    `exclude_from_weight_decay=['batch_normalization', 'bias']` (Model Garden reuses that list for adaptation).
    Keras variable names differ (`gamma`/`beta`, not the layer name), hence the default `("bias", "gamma", "beta")`.

    Args:
        learning_rate: a float or a `LearningRateSchedule` (LARS recipes use warmup + polynomial/cosine decay).
        momentum: momentum in [0, 1).
        weight_decay: L2 coefficient added to the gradient before the trust ratio.
        trust_coefficient: LARS eta (Model Garden `eeta`).
        nesterov: use Nesterov momentum.
        exclude_names: variables whose name matches one of these regexes get no decay and no adaptation.
        **kwargs: other `keras.optimizers.Optimizer` arguments (`name`, `clipnorm`, ...).
    """

    def __init__(
        self,
        learning_rate=0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        nesterov: bool = False,
        exclude_names: tuple[str, ...] | list[str] | None = NO_DECAY_NAMES,
        name: str = "lars",
        **kwargs,
    ):
        # weight_decay is not passed on: the base class would add Keras' decoupled decay on top of ours.
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"LARS: momentum must be in [0, 1); received momentum={momentum}.")
        if trust_coefficient <= 0:
            raise ValueError(
                f"LARS: trust_coefficient must be > 0; received trust_coefficient={trust_coefficient}."
            )
        self.momentum = float(momentum)
        self.l2 = float(weight_decay or 0.0)
        self.trust_coefficient = float(trust_coefficient)
        self.nesterov = nesterov
        self.exclude_names = list(exclude_names or [])
        self.exclude_from_weight_decay(var_names=self.exclude_names)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momentums = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        velocity = self.momentums[self._get_variable_index(variable)]
        momentum = ops.cast(self.momentum, dtype)
        # One name check drives both decay and adaptation (Model Garden's default when only one list is given).
        adapted = self._use_weight_decay(variable)
        if adapted and self.l2:
            gradient = gradient + ops.cast(self.l2, dtype) * variable
        if adapted:
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            g_norm = ops.sqrt(ops.sum(ops.square(gradient)))
            # A safe denominator: ops.where computes both branches, and a 0/0 there would trip NaN checkers.
            ratio = self.trust_coefficient * w_norm / ops.where(g_norm > 0, g_norm, 1.0)
            trust = ops.where(ops.logical_and(w_norm > 0, g_norm > 0), ratio, 1.0)
            lr = lr * ops.cast(trust, dtype)
        next_velocity = momentum * velocity + lr * gradient
        self.assign(velocity, next_velocity)
        update = momentum * next_velocity + lr * gradient if self.nesterov else next_velocity
        self.assign_sub(variable, update)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "weight_decay": self.l2,
                "trust_coefficient": self.trust_coefficient,
                "nesterov": self.nesterov,
                "exclude_names": self.exclude_names,
            }
        )
        return config


def build_schedule(train, learning_rate: float, total_steps: int):
    """The learning rate (a float or a schedule) named by `train.schedule`, peaking at `learning_rate`.

    `schedule: step` multiplies by `train.decay_rate` (default 0.1) at the fractions `train.decay_boundaries`
    (default (0.5, 0.75)) of `total_steps`: fractions, so a recipe survives a change of batch size or epochs.
    """
    schedule = train.schedule
    warmup_steps = (
        train.warmup_steps
    )  # longer than the run (a smoke test): the run stops mid-warmup
    if schedule == "constant":
        return (
            learning_rate
            if not warmup_steps
            else WarmupCosine(learning_rate, warmup_steps, total_steps, cosine=False)
        )
    if schedule == "cosine":
        return WarmupCosine(learning_rate, warmup_steps, total_steps, cosine=True)
    if schedule == "step":
        fractions = tuple(getattr(train, "decay_boundaries", (0.5, 0.75)))
        if any(not 0.0 < f < 1.0 for f in fractions) or list(fractions) != sorted(fractions):
            raise ValueError(
                f"train.decay_boundaries must be increasing fractions of training in (0, 1); received {fractions!r}. "
                "Fix: e.g. [0.5, 0.75] decays at half and three quarters of the run."
            )
        boundaries = [int(round(f * total_steps)) for f in fractions]
        return WarmupStepDecay(
            learning_rate, warmup_steps, boundaries, getattr(train, "decay_rate", 0.1)
        )
    raise ValueError(
        f"train.schedule must be one of constant, cosine, step; received {schedule!r}."
    )


def keras_optimizer_args(train) -> dict:
    """The Keras `Optimizer` arguments for `train.gradient_accumulation_steps`, `ema_momentum` and `global_clipnorm`.

    Every optimizer `build_optimizer` returns takes them (Keras' base class does the work, see
    keras/src/optimizers/base_optimizer.py in Keras 3.15):

    * `gradient_accumulation_steps=k`: each batch adds its gradient to an accumulator; every k-th batch applies the
      mean of the k gradients (`(g + sum_of_previous) / k`, then clipping and weight decay) and resets it. Every
      batch advances the private counter `_iterations`, which the learning-rate schedule reads (schedules count
      batches, like `total_steps`); the public `optimizer.iterations` is `_iterations // k`, the updates made.
      1 means every batch, so it is left out (Keras requires k >= 2).
    * `ema_momentum=m`: `use_ema=True`; after every batch the optimizer's "average" variables become
      `m * average + (1 - m) * weight` (the first update copies the weights), and `fit` copies them into the
      model when it returns (`finalize_variable_values`), so evaluation and the exported model use the average.
      They are optimizer variables, so checkpoints hold them and a resume continues the same average.
    * `global_clipnorm=c`: the gradients (after accumulation) are scaled together so their global L2 norm is at
      most c, before weight decay and the update.
    """
    args = {}
    steps = getattr(train, "gradient_accumulation_steps", None)
    if steps and steps > 1:
        args["gradient_accumulation_steps"] = int(steps)
    momentum = getattr(train, "ema_momentum", None)
    if momentum is not None:
        args.update(use_ema=True, ema_momentum=float(momentum))
    clipnorm = getattr(train, "global_clipnorm", None)
    if clipnorm is not None:
        args["global_clipnorm"] = float(clipnorm)
    return args


def build_optimizer(
    train, total_steps: int, global_batch_size: int | None = None
) -> keras.optimizers.Optimizer:
    """The optimizer named by `train.optimizer` with `train.schedule` over `total_steps` steps.

    Args:
        train: the recipe's `TrainConfig` (optimizer, learning_rate, momentum, weight_decay, schedule, warmup_steps;
            optionally reference_batch_size, decay_boundaries, decay_rate, trust_coefficient,
            gradient_accumulation_steps, ema_momentum, global_clipnorm: see `keras_optimizer_args`).
        total_steps: batches in the whole run (epochs * steps_per_epoch); with gradient accumulation the schedule
            still counts batches, not updates.
        global_batch_size: needed when `train.reference_batch_size` is set: the learning rate is then scaled
            linearly from the reference batch to this one (`scaled_learning_rate`).

    Raises:
        ValueError: an option does not fit (the message names the key, the value and the fix); a `RecipeError`
            for gradient accumulation on 2+ MirroredStrategy replicas.
    """
    learning_rate = train.learning_rate
    reference = getattr(train, "reference_batch_size", None)
    if reference:
        if global_batch_size is None:
            raise ValueError(
                f"train.reference_batch_size={reference} scales the learning rate to the global batch size, but "
                "build_optimizer received no global_batch_size. Fix: pass global_batch_size=data.global_batch_size."
            )
        learning_rate = scaled_learning_rate(learning_rate, global_batch_size, reference)
    learning_rate = build_schedule(train, learning_rate, total_steps)
    name, weight_decay = train.optimizer, train.weight_decay
    common = keras_optimizer_args(train)
    if name == "adam":
        if weight_decay:
            raise ValueError(
                f"train.weight_decay={weight_decay} with optimizer 'adam': Adam has no weight decay. "
                "Fix: set train.optimizer: adamw (decoupled decay), or train.weight_decay: 0."
            )
        return keras.optimizers.Adam(learning_rate, **common)
    if name == "adamw":
        optimizer = keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay, **common)
    elif name == "lamb":
        optimizer = keras.optimizers.Lamb(
            learning_rate, weight_decay=weight_decay or None, **common
        )
    elif name == "sgd":
        return SGDWithL2(
            learning_rate, momentum=train.momentum, weight_decay=weight_decay, **common
        )
    elif name == "lars":
        trust = getattr(train, "trust_coefficient", 0.001)
        return LARS(
            learning_rate,
            momentum=train.momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust,
            **common,
        )
    else:
        raise ValueError(
            f"train.optimizer must be one of adam, adamw, lamb, lars, sgd; received {name!r}."
        )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY_NAMES))
    return optimizer

"""The names a scenario may give to models, activations, the personal split and algorithms,
with one line each for ``raysim list``.

Torch-free on purpose: a scenario is validated (and Ray's start-up begun) before torch
loads. The builders (:mod:`raysim.models`, :mod:`raysim.algorithms`) map these names to code.
"""

from __future__ import annotations

from raysim.errors import ScenarioError

MODELS = {
    "logreg": "multinomial logistic regression (one Linear layer)",
    "mlp": "fully connected net; keys model.hidden (sizes), model.activation",
    "cnn": "small conv net for image data (digits, or parquet with data.image_shape); key model.channels",
    "quadratic": "the parameters (theta, w) of data.kind=quadratic, both starting at 0; personal part: "
                 "model.personal=[w]",
}

ACTIVATIONS = ("elu", "relu", "sigmoid", "tanh")

PERSONAL_MODES = ("none", "input_layer", "output_layer", "adapter")
PERSONAL_INITS = ("random", "zero", "global")

ALGORITHMS = {
    "fedavg": "FedAvg: local SGD (algorithm.lr, batch_size, local_epochs | local_steps, "
              "weight_decay), sample-weighted averaging with algorithm.server_lr",
    "ffgg": "FFGG (partial personalisation, Algorithm 1; async: Algorithm 3): fine-tune the personal "
            "part (model.personal) with algorithm.finetuner sgd|cg|exact for local_steps at personal_lr, "
            "send the partial gradient; server step server_lr via server_optimizer",
    "local_ffgg": "Local FFGG (Algorithm 4): fine-tune w, then alternate w and θ steps (personal_lr, "
                  "lr); pretrain_rounds of FedAvg first; server_optimizer sgd|adam",
    "localgd": "Local GD: local_steps gradient steps on the shared model, FedAvg averaging",
    "scaffold": "SCAFFOLD (option II control variates, stateful clients): local_steps at lr, server_lr = η_g",
    "l2gd": "L2GD (per-client models, stateful): penalty λ, average_prob p (null: 1/local_steps); "
            "full participation",
}


def check_init(personal, how: str) -> None:
    """Validate ``model.personal_init`` against ``model.personal``."""
    if how not in PERSONAL_INITS:
        raise ScenarioError("model.personal_init", how, "one of " + ", ".join(PERSONAL_INITS))
    if how == "zero" and personal == "adapter":
        raise ScenarioError("model.personal_init", how,
                            "random or global with model.personal=adapter (a zero LoRA pair has zero gradient)")

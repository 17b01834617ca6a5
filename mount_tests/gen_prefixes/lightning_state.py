"""PyTorch Lightning's own part of a checkpoint, shared by gen/generate.py (DeepSpeedStrategy: DeepSpeed's
client_state, at the top level of the model-state files) and generate_lightning_fsdp.py (FSDPStrategy with
state_dict_type="sharded": meta.pt).  Both strategies save Trainer.save_checkpoint's dict
(lightning/pytorch/trainer/connectors/checkpoint_connector.py dump_checkpoint) less ``state_dict`` and
``optimizer_states``, which they write their own way.  Only torch besides the standard library (imported when
called): the file is copied beside generate_lightning_fsdp.py in the chroot.
"""

# ModelCheckpoint's default dirpath and filename ("{epoch}-{step}" -> "epoch=0-step=3" + ".ckpt"), under the
# default logger's version folder
CHECKPOINTS = "lightning_logs/version_0/checkpoints"


def ckpt_path(epoch, step):
    return f"{CHECKPOINTS}/epoch={epoch}-step={step}.ckpt"


def lightning_state(step, version, lr=0.0003, lr_schedulers=()):
    """dump_checkpoint()'s dict without state_dict and optimizer_states, after `step` steps of epoch 0 (a
    precision without plugin state: "bf16-mixed", "16-mixed" with DeepSpeed's own scaler, "32-true")."""
    import torch

    def progress(n, completed=None):
        return {"ready": n, "completed": n if completed is None else completed, "started": n, "processed": n}

    monitor = ("ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
               "'train_time_interval': None}")
    return {"epoch": 0, "global_step": step, "pytorch-lightning_version": version,
            "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": step},
                                   "epoch_loop.batch_progress": {"total": progress(step), "current": progress(step),
                                                                 "is_last_batch": True},
                                   "epoch_progress": {"total": progress(1, 0), "current": progress(1, 0)}},
                      "validate_loop": {"state_dict": {}}, "test_loop": {"state_dict": {}},
                      "predict_loop": {"state_dict": {}}},
            "callbacks": {monitor: {"monitor": None, "best_model_score": None,
                                    "best_model_path": "/runs/" + ckpt_path(0, step), "current_score": None,
                                    "dirpath": "/runs/" + CHECKPOINTS, "best_k_models": {},
                                    "kth_best_model_path": "", "kth_value": torch.tensor(float("inf")),
                                    "last_model_path": ""}},
            "lr_schedulers": list(lr_schedulers), "hparams_name": "kwargs",
            "hyper_parameters": {"model_name": "tiny-llama", "lr": lr}}

"""Protocol arithmetic of the scaling study: accumulation, global batch, LR rules, optimiser updates
per epoch (checked against DistributedSampler and a real Lightning loop), speed-up, efficiency."""

import math

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from cropscale import CropScaleError
from cropscale.study import protocol as P


@pytest.mark.parametrize("n,acc", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_equal_global_matches_accumulation(n, acc):
    plan = P.batch_plan("equal-global", n, local_batch=1, global_batch=8, base_lr=1e-3, lr_scaling="sqrt")
    assert (plan.accumulation, plan.global_batch, plan.local_batch) == (acc, 8, 1)
    # G is fixed, the reference batch defaults to G: the LR is the base LR for every N, any rule.
    assert plan.reference_batch == 8
    assert plan.lr == pytest.approx(1e-3)


def test_accumulation_factor_values_and_errors():
    assert P.accumulation_factor(32, 2, 4) == 4
    assert P.accumulation_factor(8, 2, 2) == 2
    with pytest.raises(CropScaleError, match=r"global batch 1 cannot be split across 2 ranks"):
        P.accumulation_factor(1, 1, 2)
    with pytest.raises(CropScaleError, match=r"8/16 = 0.5 is not a whole number"):
        P.accumulation_factor(8, 4, 4)
    with pytest.raises(CropScaleError, match=r"global batch divisible by 4"):
        P.accumulation_factor(6, 1, 4)
    with pytest.raises(CropScaleError, match="local batch must be an integer"):
        P.accumulation_factor(8, 0, 1)


@pytest.mark.parametrize(
    "rule,lrs",
    [
        ("none", [1e-3, 1e-3, 1e-3, 1e-3]),
        ("linear", [1e-3, 2e-3, 4e-3, 8e-3]),
        ("sqrt", [1e-3, 1e-3 * math.sqrt(2), 2e-3, 1e-3 * math.sqrt(8)]),
    ],
)
def test_equal_local_global_batch_and_lr_rules(rule, lrs):
    for n, lr in zip((1, 2, 4, 8), lrs, strict=True):
        plan = P.batch_plan("equal-local", n, local_batch=4, base_lr=1e-3, lr_scaling=rule)
        assert (plan.accumulation, plan.global_batch, plan.reference_batch) == (1, 4 * n, 4)
        assert plan.lr == pytest.approx(lr, rel=1e-12)


def test_explicit_reference_batch_and_plan_errors():
    # base LR tuned at global batch 1 (the study's historical batch): linear rule at G = 8 gives 8x.
    plan = P.batch_plan("equal-global", 2, 1, 8, base_lr=5e-4, lr_scaling="linear", reference_batch=1)
    assert plan.lr == pytest.approx(4e-3)
    plan = P.batch_plan("equal-local", 8, 2, base_lr=1e-3, lr_scaling="sqrt", reference_batch=4)
    assert plan.lr == pytest.approx(2e-3)  # G = 16 vs 4: sqrt(4) = 2
    with pytest.raises(CropScaleError, match="needs a global_batch"):
        P.batch_plan("equal-global", 2, 1)
    with pytest.raises(CropScaleError, match="fixes the local batch"):
        P.batch_plan("equal-local", 2, 1, global_batch=8)
    with pytest.raises(CropScaleError, match="protocol must be one of"):
        P.batch_plan("equal-updates", 2, 1)
    with pytest.raises(CropScaleError, match="lr_scaling must be one of"):
        P.batch_plan("equal-local", 2, 1, lr_scaling="cubic")


def test_optimizer_updates_per_epoch_study_numbers():
    # PASTIS folds 1-3: 1,455 training patches, one crop each.
    s = 1455
    # equal-global G = 8 at local batch 1: ceil(ceil(1455 / N) / (8 / N)) = 182 for every N
    assert [P.optimizer_updates_per_epoch(s, 1, n, 8 // n) for n in (1, 2, 4, 8)] == [182, 182, 182, 182]
    # equal-local L = 1: ceil(1455 / N) batches, one update each
    assert [P.optimizer_updates_per_epoch(s, 1, n, 1) for n in (1, 2, 4, 8)] == [1455, 728, 364, 182]
    # the CPU study: 8 samples, equal-local L = 2
    assert [P.optimizer_updates_per_epoch(8, 2, n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]
    # a partial accumulation window at the end of the epoch still steps: 10 batches, A = 3 -> 4
    assert P.optimizer_updates_per_epoch(10, 1, 1, 3) == 4
    assert P.optimizer_updates_per_epoch(10, 2, 4, drop_last=True) == 1  # ceil((10-4)/4) = 2 samples/rank
    with pytest.raises(CropScaleError, match="no batch"):
        P.optimizer_updates_per_epoch(3, 4, 1, drop_last=True)


@pytest.mark.parametrize("samples,local,n,drop_last", [(1455, 1, 8, False), (10, 3, 4, False), (10, 2, 4, True),
                                                      (7, 2, 2, False), (7, 2, 3, True)])
def test_batches_per_rank_equals_distributed_sampler(samples, local, n, drop_last):
    ds = TensorDataset(torch.zeros(samples, 1))
    for rank in range(n):
        sampler = DistributedSampler(ds, num_replicas=n, rank=rank, shuffle=False, drop_last=drop_last)
        loader = DataLoader(ds, batch_size=local, sampler=sampler, drop_last=drop_last)
        assert len(sampler) == P.samples_per_rank(samples, n, drop_last)
        assert len(loader) == P.batches_per_rank(samples, local, n, drop_last)


def test_optimizer_updates_per_epoch_equals_lightning_loop(tmp_path):
    """A real Lightning 2.x fit on one CPU process: optimizer steps per epoch = ceil(B / A)."""
    from lightning.pytorch import LightningModule, Trainer

    torch.set_num_threads(1)

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    samples, local, acc, epochs = 11, 2, 4, 2  # B = 6 batches, A = 4 -> 2 updates per epoch
    loader = DataLoader(TensorDataset(torch.zeros(samples, 1)), batch_size=local)
    trainer = Trainer(max_epochs=epochs, accumulate_grad_batches=acc, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                      default_root_dir=tmp_path)
    trainer.fit(Tiny(), loader)
    expected = P.optimizer_updates_per_epoch(samples, local, 1, acc)
    assert expected == 2
    assert trainer.global_step == expected * epochs
    assert trainer.estimated_stepping_batches == expected * epochs


def test_speedup_efficiency_from_given_times():
    assert P.speedup(120.0, 48.0) == pytest.approx(2.5)
    assert P.efficiency(2.5, 4) == pytest.approx(0.625)
    s2 = P.speedup(10.0, 5.5)
    assert s2 == pytest.approx(1.818181818)
    assert P.efficiency(s2, 2) == pytest.approx(0.909090909)
    with pytest.raises(CropScaleError, match="T_N must be a positive time"):
        P.speedup(1.0, 0.0)


def test_karp_flatt_prediction():
    # Amdahl's table of STUDY.md: 35 % serial on 8 GPUs -> 2.32x; 10 % on 4 -> 3.08x
    assert 1.0 / P.karp_flatt_time_ratio(8, 0.35) == pytest.approx(2.32, abs=0.005)
    assert 1.0 / P.karp_flatt_time_ratio(4, 0.10) == pytest.approx(3.08, abs=0.005)
    # a measured slow-down (e > 1) extrapolates as it stands: T_2 / T_1 = 1.2 + (1 - 1.2) / 2
    assert P.karp_flatt_time_ratio(2, 1.2) == pytest.approx(1.1)
    # T_N = T_1 (e + (1 - e)/N) + U_N (t_c(N) - t_c(N_ref)) = 100 (0.2 + 0.2) + 10 x 0.3
    assert P.predicted_epoch_time(100.0, 4, 0.2, 10, 0.5, 0.2) == pytest.approx(43.0)
    with pytest.raises(CropScaleError, match="non-positive time"):
        P.karp_flatt_time_ratio(8, -0.5)


# ------------------------------------------------------------------ batch sweep: G = L x N x A, updates
@pytest.mark.parametrize("g,max_local,sizes,max_acc,expected", [
    (4, 4, [1], None, (4, 1, 1)),            # the CPU sweep: local 4 x 1 process x accumulation 1 / 2 / 4 / 8
    (8, 4, [1], None, (4, 1, 2)),
    (16, 4, [1], None, (4, 1, 4)),
    (32, 4, [1], 8, (4, 1, 8)),
    (8192, 32, [1, 2, 4, 8], None, (32, 8, 32)),  # 32 x 8 x 32 = 8,192
    (4, 32, [1, 2, 4, 8], None, (1, 4, 1)),       # G = 4 cannot use 8 ranks: 4 ranks of 1 sample
    (6, 4, [1, 2, 4], None, (3, 2, 1)),           # 4 does not divide 6; 6 / 2 = 3 <= 4
    (20, 8, [1, 2, 4], None, (5, 4, 1)),
    (20, 4, [1, 2, 4], None, (1, 4, 5)),          # 20 / 4 = 5 > 4 and 4, 3, 2 do not divide 5: L = 1, A = 5
])
def test_realise_global_batch_hand_examples(g, max_local, sizes, max_acc, expected):
    assert P.realise_global_batch(g, max_local, sizes, max_acc) == expected


def test_realise_global_batch_is_exact_and_follows_the_rule_by_brute_force():
    for g in range(1, 97):
        for max_local in (1, 3, 4, 16):
            for sizes in ([1], [1, 2], [1, 2, 4, 8], [3, 6]):
                if not any(g % n == 0 for n in sizes):
                    with pytest.raises(CropScaleError, match="cannot be split evenly"):
                        P.realise_global_batch(g, max_local, sizes)
                    continue
                local, n, acc = P.realise_global_batch(g, max_local, sizes)
                assert local * n * acc == g
                # brute force over every (L, N, A) within the limits: fewest micro-batches in sequence
                # (largest N), then the largest L
                triples = [(loc, m, g // (loc * m)) for m in sizes for loc in range(1, max_local + 1)
                           if g % (loc * m) == 0]
                best = max(triples, key=lambda t: (t[1], t[0]))
                assert (local, n, acc) == best


def test_realise_global_batch_refusals_give_the_numbers():
    with pytest.raises(CropScaleError, match="global batch 64 needs accumulation 16 = 64 / .local batch 4 x 1"
                                             r" rank\(s\)., above the limit of 8"):
        P.realise_global_batch(64, 4, [1], 8)
    with pytest.raises(CropScaleError, match="global batch 12 cannot be split evenly across any of .8. ranks"):
        P.realise_global_batch(12, 4, [8])
    with pytest.raises(CropScaleError, match="no world size"):
        P.realise_global_batch(12, 4, [])


@pytest.mark.parametrize("rule,lr", [("none", 1e-3), ("linear", 8e-3), ("sqrt", 1e-3 * math.sqrt(8))])
def test_sweep_plan_lr_follows_the_rule(rule, lr):
    plan = P.sweep_plan(32, 4, [1], 1e-3, rule, 4, optimizer="lamb")
    assert (plan.protocol, plan.local_batch, plan.world_size, plan.accumulation, plan.global_batch) == (
        "batch-sweep", 4, 1, 8, 32)
    assert plan.lr == pytest.approx(lr, rel=1e-12) and plan.optimizer == "lamb" and plan.reference_batch == 4


def test_update_windows_hand_counts():
    # the CPU sweep: 32 samples, L = 4 on 1 process: B = 8 micro-batches, A = 1 / 2 / 4 / 8 -> 8 / 4 / 2 / 1
    assert [P.update_windows(32, 4, 1, a).updates for a in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert P.update_windows(32, 4, 1, 8) == P.UpdateWindows(1, 1, 32)
    # G = 64 over 32 samples (A = 16): one update of 32 samples, no full batch
    assert P.update_windows(32, 4, 1, 16) == P.UpdateWindows(1, 0, 32)
    # PASTIS-HD, 1,455 patches x 8 crops = 11,640 samples, G = 8,192 = 32 x 8 x 32: 1,455 samples per rank,
    # B = ceil(1455 / 32) = 46, U = ceil(46 / 32) = 2; the second update holds 8 x (1455 - 32 x 32) = 3,448
    assert P.update_windows(11640, 32, 8, 32) == P.UpdateWindows(2, 1, 3448)
    # 11 samples, L = 2, A = 4: B = 6 -> U = 2, last window = batches 5 and 6 = 2 + 1 samples
    assert P.update_windows(11, 2, 1, 4) == P.UpdateWindows(2, 1, 3)


def test_update_windows_last_samples_equal_a_real_lightning_loop(tmp_path):
    """Samples per optimizer update in a real Lightning 2.x fit: every window but the last holds G."""
    from lightning.pytorch import LightningModule, Trainer

    torch.set_num_threads(1)

    class Counting(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen, self.per_update = 0, []

        def training_step(self, batch, batch_idx):
            self.seen += batch[0].shape[0]
            return self.layer(batch[0]).sum()

        def on_before_optimizer_step(self, optimizer):
            self.per_update.append(self.seen)
            self.seen = 0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    samples, local, acc = 11, 2, 4
    module = Counting()
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=acc, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                      default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(TensorDataset(torch.zeros(samples, 1)), batch_size=local))
    windows = P.update_windows(samples, local, 1, acc)
    assert module.per_update == [8] * windows.full_updates + [windows.last_update_samples] == [8, 3]

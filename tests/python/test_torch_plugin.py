"""commsched.torch on real processes: workers under `commsched launch` (one PS server) train a small model and must
reproduce single-process training on the combined batch; wfbp and bytescheduler, with and without cross-iteration
mode, must agree bitwise when the servers sum in rank order (COMMSCHED_PS_DETERMINISTIC=1)."""
import pytest
import torch

from torch_cluster import HERE, launch, run_single
from torch_model import train_reference

STEPS = 20
BATCH = 8  # per worker
KINDS = ("sgd", "adam")
# Small partitions so tensors really are split, and a credit far below the model's size so the scheduler really
# holds partitions back (with the servers' push acknowledgement, per-worker credit no longer deadlocks).
ENGINE_ENV = {"COMMSCHED_PARTITION_BYTES": "1KiB", "COMMSCHED_CREDIT_BYTES": "4KiB"}


def train(tmp_path, workers, policy, cross, servers=1, transport=None):
    out = tmp_path / f"w{workers}-{policy}-cross{int(cross)}-s{servers}-{transport}"
    out.mkdir()
    # (With cross-iteration on, the worker itself fails unless step() really left updates to the forward hooks.)
    env = dict(ENGINE_ENV, COMMSCHED_POLICY=policy, COMMSCHED_CROSS_ITERATION=int(cross))
    rc, log = launch(workers, [HERE / "torch_worker.py", "--out", out, "--steps", STEPS, "--batch", BATCH], env,
                     servers=servers, transport=transport)
    assert rc == 0, log
    return {k: [torch.load(out / f"{k}.{r}.pt") for r in range(workers)] for k in KINDS}


def relative_error(state, ref):
    num = sum(float((state[k].double() - ref[k].double()).norm() ** 2) for k in ref)
    den = sum(float(ref[k].double().norm() ** 2) for k in ref)
    return (num / den) ** 0.5


def assert_bitwise(a, b, what):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: '{k}' differs (max abs {float((a[k] - b[k]).abs().max())})"


def check_against_reference(results, workers):
    for kind in KINDS:
        ranks = results[kind]
        for r in range(1, workers):
            assert_bitwise(ranks[0], ranks[r], f"{kind}: rank {r} vs rank 0")
        ref = train_reference(kind, STEPS, BATCH * workers)
        # The model really trained (so equality is not trivial) ...
        assert relative_error(ranks[0], train_reference(kind, 0, BATCH * workers)) > 1e-2
        # ... and exactly as one process on the combined batch would have (up to float rounding of the sums).
        err = relative_error(ranks[0], ref)
        assert err <= 1e-6, f"{kind}, {workers} workers: relative error {err:.3g} against single-process training"


@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross-iteration"])
def test_two_workers_match_single_process_and_policies_agree_bitwise(tmp_path, cross):
    wfbp = train(tmp_path, 2, "wfbp", cross)
    sched = train(tmp_path, 2, "bytescheduler", cross)
    check_against_reference(sched, 2)
    for kind in KINDS:
        assert_bitwise(wfbp[kind][0], sched[kind][0], f"{kind}: wfbp vs bytescheduler (cross={cross})")


# BSP and MG-WFBP hold gradients until the end of backward; the eager calls before training (broadcast_parameters,
# broadcast_optimizer_state) are released by Engine::flush, so they neither hang nor become MG-WFBP's learning iteration.
@pytest.mark.parametrize("policy", ["bsp", "mgwfbp"])
def test_holding_policies_train_like_single_process(tmp_path, policy):
    check_against_reference(train(tmp_path, 2, policy, False), 2)


@pytest.mark.parametrize("transport", ["zmq", "ucx"])
def test_four_workers_match_single_process_with_and_without_cross_iteration(tmp_path, transport):
    plain = train(tmp_path, 4, "bytescheduler", False, transport=transport)
    cross = train(tmp_path, 4, "wfbp", True, transport=transport)
    check_against_reference(plain, 4)
    for kind in KINDS:
        assert_bitwise(plain[kind][0], cross[kind][0], f"{kind}: bytescheduler vs wfbp+cross-iteration")


def test_gloo_allreduce_without_servers_matches_single_process(tmp_path):
    """`commsched launch -s 0`: no parameter server, the workers all-reduce with Gloo (the engine's credit goes to
    the collective's global credit on rank 0); same results as one process on the combined batch."""
    sched = train(tmp_path, 2, "bytescheduler", True, servers=0)
    check_against_reference(sched, 2)


def test_single_process_without_cluster_uses_loopback(tmp_path):
    rc, log = run_single([HERE / "torch_worker.py", "--out", tmp_path, "--steps", 5, "--batch", BATCH])
    assert rc == 0, log
    for kind in KINDS:
        state = torch.load(tmp_path / f"{kind}.0.pt")
        assert relative_error(state, train_reference(kind, 5, BATCH)) <= 1e-6


def test_commsched_torch_imports_before_torch(tmp_path):
    """A script whose first import is commsched.torch: with a CUDA build of torch whose wheel brings a newer NCCL than
    commsched was built with, importing commsched's NCCL first made torch's import fail."""
    script = tmp_path / "first.py"
    script.write_text("import commsched.torch as hvd\nimport torch\nprint('imported', torch.__version__)\n")
    rc, log = run_single([script])
    assert rc == 0 and "imported" in log, log


def test_horovod_style_script_runs_with_only_the_import_changed():
    rc, log = launch(2, [HERE / "horovod_style_script.py"], dict(ENGINE_ENV), deterministic=False)
    assert rc == 0, log
    assert "horovod-style script: OK" in log, log


def test_step_before_init_is_a_clear_error():
    code = ("import torch, commsched.torch as hvd\n"
            "m = torch.nn.Linear(2, 1)\n"
            "opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), "
            "named_parameters=m.named_parameters())\n"
            "m(torch.ones(1, 2)).sum().backward()\n"
            "opt.step()\n")
    rc, log = run_single(["-c", code])
    assert rc != 0
    assert "commsched.torch has not been initialized: call commsched.torch.init() first" in log, log


@pytest.mark.parametrize("cross", ["1", "0"])
def test_zero_grad_defaults_to_what_the_wrapped_optimizer_does(cross):
    """torch 2.x's zero_grad() sets p.grad to None by default (1.13's zeroes it); Horovod's wrapper inherits that, so
    a script that tests `p.grad is None` after zero_grad() sees the same with and without the wrapper."""
    code = ("import torch, commsched.torch as hvd\n"
            "hvd.init()\n"
            "m = torch.nn.Linear(2, 1)\n"
            "plain = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "m(torch.ones(1, 2)).sum().backward()\n"
            "plain.zero_grad()\n"
            "want = m.weight.grad is None\n"
            "opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), "
            "named_parameters=m.named_parameters(), model=m)\n"
            "for _ in range(2):\n"
            "    m(torch.ones(1, 2)).sum().backward()\n"
            "    opt.step()\n"
            "    opt.zero_grad()\n"
            "    m(torch.ones(1, 2))  # lands a deferred update (cross-iteration) and its deferred zero_grad\n"
            "print('grad is None', m.weight.grad is None, 'as torch', want)\n")
    rc, log = run_single(["-c", code], env={"COMMSCHED_CROSS_ITERATION": cross})
    assert rc == 0, log
    want = torch.__version__ >= "2"
    assert f"grad is None {want} as torch {want}" in log, log


def test_another_losss_backward_through_our_parameters_is_a_clear_error():
    """A GAN whose generator loss backpropagates into the discriminator without excluding it: the discriminator's
    optimizer counts that pass, and its next backward is one too many. The error names the parameter and the fix."""
    code = ("import torch, commsched.torch as hvd\n"
            "hvd.init()\n"
            "G, D = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)\n"
            "opt_g = hvd.DistributedOptimizer(torch.optim.SGD(G.parameters(), lr=0.1), "
            "named_parameters=[('G.' + n, p) for n, p in G.named_parameters()])\n"
            "opt_d = hvd.DistributedOptimizer(torch.optim.SGD(D.parameters(), lr=0.1), "
            "named_parameters=[('D.' + n, p) for n, p in D.named_parameters()])\n"
            "for _ in range(2):\n"
            "    fake = G(torch.ones(1, 2))\n"
            "    opt_d.zero_grad()\n"
            "    D(fake.detach()).sum().backward()\n"
            "    opt_d.step()\n"
            "    opt_g.zero_grad()\n"
            "    D(fake).sum().backward()  # reaches D's parameters too\n"
            "    opt_g.step()\n")
    rc, log = run_single(["-c", code])
    assert rc != 0, log
    assert "gradient of 'D.bias' was computed more than backward_passes_per_step=1 times" in log, log
    assert "requires_grad_(False) or detach()" in log, log


def test_model_zero_grad_while_updates_are_pending():
    """Cross-iteration mode: step() returns with the gradients still on the wire. torch 2.x's model.zero_grad() then
    sets p.grad to None: the update must still use the averaged gradient (it was skipped). Zeroing in place
    (set_to_none=False) would change what is being averaged: a clear error, not a wrong update."""
    code = ("import copy, torch, commsched.torch as hvd\n"
            "hvd.init()\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
            "ref = copy.deepcopy(m)\n"
            "opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), "
            "named_parameters=m.named_parameters())\n"
            "x = torch.randn(8, 3)\n"
            "def train(model, o):\n"
            "    for _ in range(3):\n"
            "        model.zero_grad(set_to_none=True)  # the updates of the step before are pending here\n"
            "        model(x).pow(2).mean().backward()\n"
            "        o.step()\n"
            "train(m, opt)\n"
            "print('overlap', opt.cross_iteration, 'pending', opt.pending_updates)\n"
            "opt.flush()\n"
            "train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9))\n"
            "print('as plain torch', all(torch.equal(p, q) for p, q in zip(m.parameters(), ref.parameters())))\n"
            "m(x).pow(2).mean().backward()\n"
            "opt.step()\n"
            "m.zero_grad(set_to_none=False)\n"
            "m(x)\n")
    rc, log = run_single(["-c", code])
    assert rc != 0, log
    assert "overlap True pending 4" in log and "as plain torch True" in log, log
    assert "the gradient 'grad.0.weight' was changed in place while it was being averaged" in log, log


def test_gradients_cut_from_one_buffer_are_averaged_without_a_false_in_place_error():
    """torch.cat of two parameters in the forward: backward hands both gradients as views of one buffer, which share
    autograd's version counter, so scaling one (here the predivide) bumps the other's. That is not a change by the
    user and must not raise. Compared with plain torch on the same data."""
    code = ("import copy, torch, commsched.torch as hvd\n"
            "hvd.init()\n"
            "torch.manual_seed(0)\n"
            "w1, w2 = torch.nn.Parameter(torch.randn(2, 3)), torch.nn.Parameter(torch.randn(2, 3))\n"
            "r1, r2 = copy.deepcopy(w1), copy.deepcopy(w2)\n"
            "x = torch.randn(3, 5)\n"
            "def train(a, b, opt):\n"
            "    for _ in range(3):\n"
            "        opt.zero_grad()\n"
            "        (torch.cat([a, b]) @ x).pow(2).mean().backward()\n"
            "        opt.step()\n"
            "opt = hvd.DistributedOptimizer(torch.optim.SGD([w1, w2], lr=0.1), named_parameters=[('w1', w1), ('w2', w2)],"
            " gradient_predivide_factor=2.0, cross_iteration=False)\n"
            "train(w1, w2, opt)\n"
            "train(r1, r2, torch.optim.SGD([r1, r2], lr=0.1))\n"
            "print('as plain torch', torch.allclose(w1, r1) and torch.allclose(w2, r2))\n")
    rc, log = run_single(["-c", code])
    assert rc == 0, log
    assert "as plain torch True" in log, log


def test_an_optimizer_that_sets_step_supports_amp_scaling_in_its_init_can_be_wrapped():
    """torch's fused optimizers (and subclasses fixing fused=True) set _step_supports_amp_scaling in __init__, which
    the wrapper runs again: the wrapper's own answer (GradScaler unscales the averaged gradients) must stand."""
    code = ("import torch, commsched.torch as hvd\n"
            "hvd.init()\n"
            "class Mine(torch.optim.SGD):\n"
            "    def __init__(self, params, lr=0.1):\n"
            "        super().__init__(params, lr=lr)\n"
            "        self._step_supports_amp_scaling = True\n"
            "m = torch.nn.Linear(3, 1)\n"
            "opt = hvd.DistributedOptimizer(Mine(m.parameters(), lr=0.1), named_parameters=m.named_parameters())\n"
            "m(torch.ones(2, 3)).sum().backward()\n"
            "opt.step()\n"
            "print('wrapped', opt._step_supports_amp_scaling)\n")
    rc, log = run_single(["-c", code])
    assert rc == 0, log
    assert "wrapped False" in log, log


def test_models_that_differ_across_workers_name_the_tensor(tmp_path):
    # Rank 1's first convolution has 6 channels instead of 4: the servers see different sizes for that key.
    rc, log = launch(2, [HERE / "torch_worker.py", "--out", tmp_path, "--steps", 2, "--width", 6, "--width-rank", 1],
                     dict(ENGINE_ENV), timeout=60)
    assert rc != 0, log
    assert "workers disagree about the tensor" in log, log
    assert "(tensor 'broadcast.param.0." in log, log  # the first conv's weight or bias


def test_bad_policy_names_the_variable(tmp_path):
    rc, log = run_single([HERE / "torch_worker.py", "--out", tmp_path, "--steps", 1],
                         env={"COMMSCHED_POLICY": "fastest"})
    assert rc != 0
    assert "COMMSCHED_POLICY" in log and "fastest" in log, log


def test_optimizers_that_need_every_gradient_fall_back_with_a_warning():
    code = """
import warnings, torch, commsched.torch as hvd
hvd.init()
torch.manual_seed(0)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for make in (lambda p: torch.optim.LBFGS(p, lr=0.5), lambda p: torch.optim.SGD(p, lr=0.1)):
    model = torch.nn.Linear(4, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                       model=model, cross_iteration=True)
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        first = float(closure())
        for _ in range(5):
            opt.step(closure)
    assert opt.pending_updates == 0
    with torch.no_grad():
        assert float(torch.nn.functional.mse_loss(model(x), y)) < first, "did not train"
    print(type(opt).__name__, [str(w.message) for w in caught])
hvd.shutdown()
"""
    rc, log = run_single(["-c", code])
    assert rc == 0, log
    assert "LBFGS needs every gradient at once; cross-iteration mode is off" in log, log
    assert "step(closure) needs every gradient at once; waiting in step()" in log, log


def test_hierarchical_mode_trains_like_single_process(tmp_path):
    """COMMSCHED_HIERARCHICAL=gloo: the four workers of this host reduce-scatter with Gloo, push and pull one slice
    each through the server (a lane of one machine), and all-gather; same results as one process on the combined
    batch (broadcast_parameters and broadcast_optimizer_state go through the server as they are)."""
    out = tmp_path / "hierarchical"
    out.mkdir()
    env = dict(ENGINE_ENV, COMMSCHED_POLICY="bytescheduler", COMMSCHED_HIERARCHICAL="gloo")
    rc, log = launch(4, [HERE / "torch_worker.py", "--out", out, "--steps", STEPS, "--batch", BATCH], env)
    assert rc == 0, log
    assert "hierarchical mode: 1 machine(s) x 4 workers, local collective gloo" in log, log
    check_against_reference({k: [torch.load(out / f"{k}.{r}.pt") for r in range(4)] for k in KINDS}, 4)

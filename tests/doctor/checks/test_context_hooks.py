"""The checks' hook on a user's object (checks/_context_hooks.py, ctx.user_hook): it runs the
check's function under the guard while the object lives in this process; the script's own
pickle.dumps / torch.save / copy.deepcopy of the object carries an inert no-op, never the
check's function or its context (the context holds the rank's open records file)."""
import copy
import io
import pickle
import sys

import torch

from ddp_lab.doctor.checks._context_hooks import INERT, UserHook
from ddp_lab.doctor.checks.api import Context


def hooked(tmp_path):
    ctx = Context(__file__, records_path=str(tmp_path / "records.jsonl"))  # an open file
    seen = []
    net = torch.nn.Linear(2, 1)
    net.register_forward_pre_hook(ctx.user_hook(lambda m, args: seen.append(m)))
    net.register_forward_hook(ctx.user_hook(lambda m, args, out: 1 / 0))  # the check's bug
    return ctx, net, seen


def test_the_hook_runs_the_check_under_the_guard(tmp_path):
    ctx, net, seen = hooked(tmp_path)
    out = net(torch.ones(1, 2))
    assert seen == [net] and out.shape == (1, 1)  # the script goes on past the check's error
    assert any("ZeroDivisionError" in e for e in ctx.records["check-errors"])


def test_a_pickled_or_saved_model_carries_an_inert_hook(tmp_path):
    ctx, net, seen = hooked(tmp_path)
    with torch.no_grad():
        want = net(torch.ones(3, 2))
    for again in (pickle.loads(pickle.dumps(net)),
                  torch.load(io.BytesIO(_saved(net)), weights_only=False)):
        hooks = [*again._forward_pre_hooks.values(), *again._forward_hooks.values()]
        assert len(hooks) == 2 and all(not isinstance(h, UserHook) for h in hooks)
        assert all(h.func is sys.audit and h.args == (INERT,) for h in hooks)
        seen.clear()
        errors = len(ctx.records["check-errors"])
        with torch.no_grad():
            assert torch.equal(again(torch.ones(3, 2)), want)
        assert seen == [] and len(ctx.records["check-errors"]) == errors  # inert
    assert b"ddp_lab" not in pickle.dumps(net)  # no module of ours: loads where ddp-lab is not


def test_a_deep_copy_does_not_copy_the_check_or_its_context(tmp_path):
    ctx, net, seen = hooked(tmp_path)
    twin = copy.deepcopy(net)  # the script's EMA copy
    hooks = [*twin._forward_pre_hooks.values(), *twin._forward_hooks.values()]
    assert all(not isinstance(h, UserHook) for h in hooks)
    twin(torch.ones(1, 2))
    assert seen == []  # the copy is another model: the check does not see it
    net(torch.ones(1, 2))
    assert seen == [net]  # the original's hook is still the check's
    assert not ctx._out.closed


def test_a_tensor_hook_is_not_warned_of_when_the_tensor_is_saved(tmp_path, recwarn):
    ctx = Context(__file__)
    w = torch.ones(2, requires_grad=True)  # a Parameter drops its hooks unwarned (parameter.py:88)
    w.register_hook(ctx.user_hook(lambda grad: None))  # a plain tensor's: torch/_tensor.py:319
    torch.load(io.BytesIO(_saved(w)), weights_only=False)
    assert not [r for r in recwarn if "will not be serialized" in str(r.message)]


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


ON_THE_OBJECT = {"register_forward_pre_hook", "register_forward_hook", "register_full_backward_hook",
                 "register_full_backward_pre_hook", "register_backward_hook", "register_hook",
                 "register_post_accumulate_grad_hook", "register_step_pre_hook",
                 "register_step_post_hook", "register_state_dict_pre_hook",
                 "register_state_dict_post_hook", "_register_state_dict_hook",
                 "register_load_state_dict_pre_hook", "register_load_state_dict_post_hook",
                 "_register_load_state_dict_pre_hook", "register_load_state_dict_post_hook"}


def test_every_hook_watch_puts_on_a_users_object_is_a_user_hook():
    """A hook stored on the user's module, optimizer or tensor (torch pickles a module's hook
    dicts with it) is registered as ctx.user_hook(...) or UserHook(...) in the checks and the
    watch core; torch's global hooks (register_optimizer_step_pre_hook,
    register_module_*_hook) live in torch's module globals and never travel with an object."""
    import ast
    from pathlib import Path

    import ddp_lab.doctor as doctor

    root = Path(doctor.__file__).parent
    files = sorted([*root.joinpath("checks").glob("*.py"), *root.joinpath("watch").glob("*.py")])
    found, bare = 0, []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ON_THE_OBJECT):
                continue
            found += 1
            arg = node.args[0] if node.args else None
            name = arg.func if isinstance(arg, ast.Call) else None
            name = getattr(name, "attr", getattr(name, "id", None))
            if name not in ("user_hook", "UserHook"):
                bare.append(f"{path.name}:{node.lineno}")
    assert found >= 7 and not bare, bare

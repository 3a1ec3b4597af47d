"""The runtime side of the checks in isolation: the watch around a call and the kernel's watch, what is
read of a result, which record files count, and the escaping of a submission's text in the reports.
(End to end, through the command line and the sandbox: tests/grading/test_grading_runtime.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from repo_paths import REPO
from transformer_lib.grading._calls import call
from transformer_lib.grading._harness import capture
from transformer_lib.grading.report.escaping import cap, csv_field, markdown
from transformer_lib.grading.protocol import Opaque, StudentError, accepted, collect


def _softmax_by_cross_entropy(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    n = x.shape[dim]
    rows = x.movedim(dim, -1).reshape(-1, n)
    p = torch.exp(-F.cross_entropy(rows.repeat_interleave(n, 0), torch.arange(n).repeat(rows.shape[0]),
                                   reduction="none"))
    return p.reshape(x.movedim(dim, -1).shape).movedim(-1, dim)


@pytest.mark.parametrize("fn, name", [
    (_softmax_by_cross_entropy, "aten._log_softmax"),  # inside cross_entropy: no Python name says softmax
    (lambda x, dim=-1: torch.exp(x - x.logcumsumexp(dim)[..., -1:]), "logcumsumexp"),
    (lambda x, dim=-1: F.softmin(-x, dim), "softmax"),
])
def test_a_banned_result_under_another_name_is_noticed(fn, name):
    x = torch.randn(3, 5)
    assert torch.allclose(fn(x), torch.softmax(x, -1), atol=1e-6)  # it is the softmax
    with pytest.raises(StudentError) as err:
        call(fn, x, banned=("softmax", "logsumexp"))
    assert (err.value.code, err.value.detail) == ("banned", name)
    assert err.value.where[1]  # the line of the student's code


def test_attention_inside_torch_s_multi_head_layer_is_noticed_at_the_aten_level():
    layer = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 4, 8)
    with torch.no_grad(), pytest.raises(StudentError) as err:
        call(lambda q: layer(q, q, q, need_weights=False)[0], x, banned=("multi_head_attention",))
    assert err.value.code == "banned"


def test_only_plain_data_is_read_and_an_object_of_the_notebook_s_is_refused():
    class Lazy(torch.Tensor):
        def clone(self, *args, **kwargs):
            return torch.softmax(self, -1)

    assert type(capture(torch.ones(2))) is torch.Tensor and capture((1, [2.0, np.float32(3)])) == [1, [2.0, 3.0]]
    assert capture({"a": torch.zeros(1)})["a"].shape == (1,) and capture(torch.Size([2, 3])) == [2, 3]
    assert capture(print) == Opaque("an object") and capture({1: 2}) == Opaque("dict")
    with pytest.raises(StudentError) as err:
        capture(torch.zeros(2).as_subclass(Lazy))
    assert err.value.code == "capture" and "def clone" in err.value.where[1]
    assert isinstance(capture([[0] * 1000] * 30)[-1], Opaque)  # 30 000 items: the last past what a result may hold


def test_work_done_while_the_result_is_read_is_noticed():
    class Sneaky(list):
        def __iter__(self):
            return iter([torch.softmax(torch.ones(2), 0)])

    with pytest.raises(StudentError) as err:
        call(lambda: Sneaky(), banned=("softmax",))
    assert err.value.code == "capture"


def test_only_the_record_files_a_cell_was_to_write_are_read(tmp_path):
    (tmp_path / "c").mkdir()
    for name in ("000-stable_softmax.npz", "abcd-002.npz", "abcd-000.npz", "abcd-001.npz", "zzzz-000.npz"):
        (tmp_path / "c" / name).write_bytes(b"not a record")
    assert [p.name for p in accepted(tmp_path / "c", "abcd", 2)] == ["abcd-000.npz", "abcd-001.npz"]
    assert [p.name for p in accepted(tmp_path / "c", "abcd", 9)] == ["abcd-000.npz", "abcd-001.npz", "abcd-002.npz"]
    (tmp_path / "c" / "abcd-001.npz").unlink()
    (tmp_path / "c" / "abcd-001.npz").symlink_to(tmp_path / "c" / "abcd-000.npz")
    assert len(accepted(tmp_path / "c", "abcd", 9)) == 1  # a link ends the list
    kept = collect(tmp_path, {"c": "abcd"}, {"c": 3}, tmp_path / "keep")["c"]
    assert len(kept) == 1 and kept[0] is None  # read when asked for: unreadable, so absent


def test_a_submission_s_text_is_capped_and_shown_as_it_is():
    html = "<img src=x onerror=alert(1)> | `code` [a](b) ![i](j) &lt; *e*"
    assert markdown(html) == r"\<img src=x onerror=alert(1)\> \| \`code\` \[a\](b) \!\[i\](j) \&lt; \*e\*"
    assert cap("a\x1b[31m\nb" + "x" * 500, 20) == "a [31m b" + "x" * 10 + " …" and len(cap("y" * 9000)) == 300
    assert csv_field("=HYPERLINK(1)") == "'=HYPERLINK(1)" and csv_field("fine") == "fine"


KERNEL = textwrap.dedent('''
    import json, sys, tempfile, torch
    from transformer_lib.grading import _watch
    from transformer_lib.grading._calls import ask_watch
    from transformer_lib.grading.run.sandbox import python_roots

    path = tempfile.mktemp()
    json.dump({"check_a": {"seed": "s", "nonce": "n", "record": "/r"}}, open(path, "w"))
    _watch.install(tuple(python_roots()), (), path)

    def secrets(cell, code):
        box = []
        exec(compile(code, "/tmp/ipykernel_0/" + cell + ".py", "exec"), {"box": box, "cell": cell})
        return box

    ASK = "def _grading_watch_secrets(cell=cell, box=box):\\n    return None\\n_grading_watch_secrets.__code__\\n"
    report = {"clean": str(ask_watch())}
    report["notebook_asks"] = secrets("check_a", ASK)
    found = ask_watch()
    report["after_asking"] = found.detail if found else "nothing"
    report["again"] = str(ask_watch())

    def _grading_watch_secrets(cell="check_a", box=[]):  # the loader's way (this file is trusted code)
        return None
    _grading_watch_secrets.__code__
    report["loader"] = list(_grading_watch_secrets.__defaults__[1])
    _grading_watch_secrets.__code__
    report["loader_again"] = _grading_watch_secrets.__defaults__[1][1:]
    # A cell's time limit: the interrupt lands in the check's profile hook (the notebook's function asks for
    # it, and the hook is the next Python code to run), so CPython switches the hook off, which the
    # watch sees as the notebook's sys.setprofile. The interrupted check owns that finding, not the next.
    import _thread
    from transformer_lib.grading._calls import call
    student = {"interrupt": _thread.interrupt_main}
    exec(compile("def late():\\n    interrupt()\\n    return 1\\n", "/tmp/ipykernel_0/y.py", "exec"), student)
    try:
        call(student["late"])
    except KeyboardInterrupt:
        report["interrupted"] = True
    report["after_interrupt"] = str(ask_watch())
    # What else an interrupted call noted stays for the next question; the notebook cannot ask to forget.
    student.update(target=sys.executable, settrace=sys.settrace, setprofile=sys.setprofile)
    exec(compile("def read_then_stop():\\n    open(target, 'rb').close()\\n    raise KeyboardInterrupt\\n"
                 "def forge():\\n    def _grading_watch_forget(box=[]):\\n        return None\\n"
                 "    _grading_watch_forget.__code__\\n"
                 "def tracer(frame, event, arg):\\n    return None\\n"
                 "def leave(set_it):\\n    set_it(tracer)\\n", "/tmp/ipykernel_0/z.py", "exec"), student)
    try:
        call(student["read_then_stop"])
    except KeyboardInterrupt:
        report["interrupted_read"] = [str(ask_watch()), str(ask_watch())]
    student["forge"]()
    report["forged"] = [str(ask_watch()), str(ask_watch())]
    # Nor can its code ask through the function call() asks with: the check's hook swapped out and back,
    # then the request (the watch forgot every sys.setprofile since the last question for that, once).
    from transformer_lib.grading._calls import _forget_dropped_hook
    student.update(getprofile=sys.getprofile, forget=_forget_dropped_hook)
    exec(compile("def sneaky(x):\\n    h = getprofile()\\n    setprofile(None)\\n    setprofile(h)\\n"
                 "    forget()\\n    return x\\n", "/tmp/ipykernel_0/s.py", "exec"), student)
    try:
        call(student["sneaky"], 1)
        report["sneaky"] = "passed"
    except Exception as err:
        report["sneaky"] = [err.detail, str(ask_watch())]
    # A trace or profile function the notebook leaves set fails every question until it is gone.
    import threading
    for kind, where in (("trace", sys), ("profile", sys), ("trace", threading)):
        student["leave"](getattr(where, "set" + kind))
        report[kind + where.__name__] = [str(ask_watch()), str(ask_watch())]
        getattr(where, "set" + kind)(None)
        report[kind + where.__name__].append(str(ask_watch()))

    exec(compile("import torch\\ntorch.Tensor.detach = lambda self: self\\n", "/tmp/ipykernel_0/x.py", "exec"), {})
    found = ask_watch()
    report["rebound"] = [found.detail, found.where[0]]

    print(json.dumps(report))
''')


def test_the_kernel_s_watch_hands_each_cell_s_secrets_out_once_and_notes_tampering(tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL, encoding="utf-8")
    # run from inside the repository's library, so that this script counts as trusted code (as a check cell)
    done = subprocess.run([sys.executable, "-c", f"exec(compile(open({str(script)!r}).read(), "
                          f"{str(REPO / 'transformer_lib' / 'x.py')!r}, 'exec'))"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["clean"] == "None" and report["notebook_asks"] == []  # the notebook gets nothing
    assert report["after_asking"] == "the notebook's code asked for a check cell's inputs" and report["again"] == "None"
    assert report["loader"] == [{"seed": "s", "nonce": "n", "record": "/r"}] and report["loader_again"] == [None]
    assert report["rebound"] == ["torch.Tensor.detach was replaced", 2]
    assert report["interrupted"] and report["after_interrupt"] == "None"
    assert report["interrupted_read"] == ["('tampered', \"the notebook's code used open\")", "None"]
    assert report["forged"] == ["('tampered', \"the notebook's code asked the watch to forget\")", "None"]
    assert report["sneaky"] == ["the notebook's code used sys.setprofile", "None"]
    for kind in ("trace", "profile"):
        assert report[kind + "sys"] == [f"('tampered', \"the notebook's code used sys.set{kind}\")",
                                        f"('tampered', 'a {kind} function is set (sys.set{kind})')", "None"]
    # threading.settrace raises no audit event: only the standing check sees it
    assert report["tracethreading"] == ["('tampered', 'a trace function is set (threading.settrace)')"] * 2 + ["None"]


def test_work_sent_to_torch_s_own_threads_is_noticed():
    def softmax_elsewhere(x):
        return torch.jit.wait(torch.jit.fork(torch.softmax, x, -1))  # torch's inter-op pool: no Python thread

    with pytest.raises(StudentError) as err:
        call(softmax_elsewhere, torch.ones(3), banned=("softmax",))
    assert err.value.code == "thread"

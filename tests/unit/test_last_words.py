"""An engine actor's last words: the scheduler's exception, found among the lines the actor's stderr kept."""

from labkit.engine import last_words as lw

TRACEBACK = '''[2026-11-28 16:07:00] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/site-packages/sglang/srt/managers/scheduler.py", line 2253, in process_input_requests
    output = self._request_dispatcher(recv_req)
  File "/v/site-packages/sglang/srt/model_executor/model_runner_components/weight_updater.py", line 373, in x
    named_tensors = self.tp_worker.deserialize_own_rank(recv_req.serialized_named_tensors)
RuntimeError: unable to open shared memory object </torch_1_2> in read-write mode: No such file or directory (2)
'''


def test_the_summary_names_the_exception_and_the_innermost_frame():
    lines = ["INFO: a line before", *TRACEBACK.splitlines(), ""]
    said = lw.summary(lw.root_cause(lines))
    assert said == ("RuntimeError: unable to open shared memory object </torch_1_2> in read-write mode: "
                    "No such file or directory (2) (at model_runner_components/weight_updater.py:373)")


def test_no_exception_keeps_the_last_lines_and_nothing_says_nothing():
    assert lw.root_cause([f"line {i}" for i in range(30)]).splitlines() == [f"line {i}" for i in range(15, 30)]
    assert lw.summary("") == "" and lw.summary("killed") == "killed"

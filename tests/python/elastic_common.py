"""What the elastic test workers share: elastic_worker.py (torch) and tf_elastic_worker.py (TensorFlow, Keras)."""
import os
import time


def wait_for_joiners(state, size):
    """ELASTIC_WAIT_FOR_SIZE=n: the last step waits (committing, so joiners are let in) until n workers train.
    size: the framework's hvd.size."""
    wanted = int(os.environ.get("ELASTIC_WAIT_FOR_SIZE", "0"))
    deadline = time.monotonic() + 90
    while size() < wanted and time.monotonic() < deadline:
        time.sleep(0.1)
        state.commit()

"""Runs an example script unchanged (runpy, as `python3 SCRIPT ARGS` would) and then prints a digest of the model it
trained, found by name among the script's globals, so the test can check that every rank ends with equal trainable
weights (batch normalization's moving statistics follow each rank's own data, in Horovod as here).

    tensorflow_example_runner.py MODEL_VARIABLE SCRIPT [ARGS...]
"""
import hashlib
import runpy
import sys

import numpy as np


def main():
    model_name, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    scope = runpy.run_path(script, run_name="__main__")
    digest = hashlib.sha256()
    for w in scope[model_name].trainable_weights:
        digest.update(np.ascontiguousarray(w.numpy()).tobytes())
    import commsched.tensorflow as hvd
    print(f"rank {hvd.rank()} weights digest {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()

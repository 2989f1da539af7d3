// Standalone module for the tuner's pytest (tests/python/test_tuner.py).
#include "tuner/python/bind_tuner.h"

PYBIND11_MODULE(_commsched_tuner, m) {
  m.doc() = "commsched Bayesian tuner (ask/tell) and search space";
  commsched_bind_tuner(m);
}

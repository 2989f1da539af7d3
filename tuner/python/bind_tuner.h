// Python bindings of the tuner's ask/tell optimizer and search space. The main module (plugins/python) calls
// commsched_bind_tuner() on itself; the standalone _commsched_tuner module exists for the tuner's own pytest.
// Knobs cross the boundary as (partition_bytes, credit_bytes) tuples, so this function registers no type that the
// main module might register too.
#pragma once

#include <pybind11/pybind11.h>

void commsched_bind_tuner(pybind11::module_& m);

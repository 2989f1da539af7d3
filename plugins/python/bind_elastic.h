// Binds elastic training's native pieces into commsched._C (see bind_elastic.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace commsched {
void bind_elastic(pybind11::module_& m);
}

// Intentionally small: the interface lives in the header.
#include "comm_backends/comm_backend.h"

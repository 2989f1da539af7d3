# The layering check, run at configure time: each product folder may include only from the folders below it, so
# every include arrow runs down and no library's headers need a library above it. A violation stops the configure
# and names the file, the include and what its folder may use.
#
#   base < options < compression < scheduler < cuda < comm_backends < workload, tuner < simulator < plugins
#
# scheduler/ knows the backends only through their interface (comm_backends/comm_backend.h, and membership.h for the
# optional join and straggler report); the interface's own files include no backend (the registry, backend_registry.*,
# does); no product build file reads anything under bench/.
cmake_policy(SET CMP0057 NEW)  # IN_LIST, also when run alone: cmake -DPROJECT_SOURCE_DIR=. -P cmake/layering.cmake
set(_layer_base "")
set(_layer_options base)
set(_layer_compression base options)
set(_layer_scheduler base options compression)
set(_layer_cuda base options compression scheduler)
set(_layer_comm_backends base options compression scheduler cuda)
set(_layer_workload base options compression scheduler comm_backends)
set(_layer_tuner base options compression scheduler)
set(_layer_simulator base options compression scheduler tuner workload)
set(_layer_plugins base options compression scheduler cuda comm_backends workload tuner simulator)
set(_layer_folders base options compression scheduler cuda comm_backends workload tuner simulator plugins)
# Single headers a lower folder may use from a higher one: the interface the lower one is written against.
set(_layer_allowed_files
  "scheduler>comm_backends/comm_backend.h"
  "scheduler>comm_backends/membership.h")
# Arrows that still run up or sideways, each with why it is not fixed yet. Keep this list short; remove rows as they go.
set(_layer_known_exceptions
  # The control plane's Van speaks the PS wire protocol over the PS transports: both belong below comm_backends/ps
  # (a wire/ folder), a move left for when nobody is changing the transports.
  "comm_backends/control/van.h>comm_backends/ps/protocol.h"
  "comm_backends/control/van.h>comm_backends/ps/transport.h"
  "comm_backends/control/roster.h>comm_backends/ps/protocol.h")

function(_layer_check_folder folder violations_var)
  set(violations "")
  file(GLOB_RECURSE files "${PROJECT_SOURCE_DIR}/${folder}/*.h" "${PROJECT_SOURCE_DIR}/${folder}/*.cc"
       "${PROJECT_SOURCE_DIR}/${folder}/*.cu")
  foreach(file ${files})
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${file}")
    file(STRINGS "${file}" includes REGEX "^#include \"[a-z_]+/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
      string(REGEX REPLACE "/.*" "" top "${path}")
      if(top STREQUAL folder OR NOT top IN_LIST _layer_folders)
        continue()
      endif()
      if(top IN_LIST _layer_${folder} OR "${folder}>${path}" IN_LIST _layer_allowed_files
         OR "${rel}>${path}" IN_LIST _layer_known_exceptions)
        continue()
      endif()
      list(APPEND violations "${rel} includes ${path} (${folder}/ may use: ${_layer_${folder}})")
    endforeach()
  endforeach()
  set(${violations_var} "${violations}" PARENT_SCOPE)
endfunction()

# Inside comm_backends: the interface's files include no backend, and the control plane includes no backend but the
# exceptions above.
function(_layer_check_backend_interface violations_var)
  set(violations "")
  foreach(rel comm_backends/comm_backend.h comm_backends/comm_backend.cc comm_backends/membership.h)
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/${rel}")
      continue()
    endif()
    file(STRINGS "${PROJECT_SOURCE_DIR}/${rel}" includes REGEX "^#include \"comm_backends/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
      if(NOT path MATCHES "^comm_backends/(comm_backend|membership|backend_registry)\\.h$")
        list(APPEND violations "${rel} includes ${path} (the backend interface includes no backend)")
      endif()
    endforeach()
  endforeach()
  file(GLOB_RECURSE control "${PROJECT_SOURCE_DIR}/comm_backends/control/*.h" "${PROJECT_SOURCE_DIR}/comm_backends/control/*.cc")
  foreach(file ${control})
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${file}")
    file(STRINGS "${file}" includes REGEX "^#include \"comm_backends/(ps|collective|gloo|nccl|hierarchical|loopback)/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
      if(NOT "${rel}>${path}" IN_LIST _layer_known_exceptions)
        list(APPEND violations "${rel} includes ${path} (the control plane includes no backend)")
      endif()
    endforeach()
  endforeach()
  set(${violations_var} "${violations}" PARENT_SCOPE)
endfunction()

function(_layer_check_bench violations_var)
  set(violations "")
  foreach(folder ${_layer_folders})
    file(GLOB_RECURSE lists "${PROJECT_SOURCE_DIR}/${folder}/CMakeLists.txt")
    foreach(file ${lists})
      file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${file}")
      file(STRINGS "${file}" hits REGEX "PROJECT_SOURCE_DIR}/bench/")
      foreach(hit ${hits})
        list(APPEND violations "${rel} reads under bench/: ${hit}")
      endforeach()
    endforeach()
  endforeach()
  set(${violations_var} "${violations}" PARENT_SCOPE)
endfunction()

set(_layer_all "")
foreach(folder ${_layer_folders})
  _layer_check_folder(${folder} found)
  list(APPEND _layer_all ${found})
endforeach()
_layer_check_backend_interface(found)
list(APPEND _layer_all ${found})
_layer_check_bench(found)
list(APPEND _layer_all ${found})
if(_layer_all)
  list(JOIN _layer_all "\n  " _layer_text)
  message(FATAL_ERROR "Layering (cmake/layering.cmake): include arrows that run up:\n  ${_layer_text}")
endif()

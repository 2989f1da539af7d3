# Copies the layering check and the folders it reads into WORK, plants an include that runs up (options/ including
# scheduler/), and expects the check to fail naming that file; exits non-zero otherwise.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/cmake")
file(COPY "${SOURCE}/cmake/layering.cmake" DESTINATION "${WORK}/cmake")
foreach(folder base options)
  file(COPY "${SOURCE}/${folder}" DESTINATION "${WORK}")
endforeach()
file(WRITE "${WORK}/options/planted_arrow.h" "#include \"scheduler/engine.h\"\n")
execute_process(COMMAND "${CMAKE_COMMAND}" -DPROJECT_SOURCE_DIR=${WORK} -P "${WORK}/cmake/layering.cmake"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "options/planted_arrow.h includes scheduler/engine.h")
  message(FATAL_ERROR "the layering check let options/ include scheduler/ (rc ${rc}):\n${err}")
endif()
file(REMOVE_RECURSE "${WORK}")

# Installs headers, static libraries and a CMake package so that another project can find_package(commsched).
include(CMakePackageConfigHelpers)
get_property(_targets GLOBAL PROPERTY COMMSCHED_EXPORTED_TARGETS)
install(TARGETS ${_targets} EXPORT commschedTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/commsched)
foreach(dir base options compression scheduler comm_backends tuner workload simulator plugins/api)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/commsched/${dir}
            FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()
install(EXPORT commschedTargets NAMESPACE commsched:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsched)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/commschedConfig.cmake.in
  ${PROJECT_BINARY_DIR}/commschedConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsched)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/commschedConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/commschedConfig.cmake ${PROJECT_BINARY_DIR}/commschedConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsched)

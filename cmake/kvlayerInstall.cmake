# Install rules and the CMake package (included by the root CMakeLists.txt when KVLAYER_INSTALL):
#   include/kvlayer/...                    public headers of core, reference and cuda
#   lib/libkvlayer_{core,reference,cuda}   the libraries (kvlayer_cuda only with the CUDA layer)
#   lib/cmake/kvlayer/                     kvlayerConfig.cmake, kvlayerConfigVersion.cmake,
#                                          kvlayerTargets*.cmake (kvlayer::core, ::reference, ::cuda)
# Consumers: find_package(kvlayer 0.1 CONFIG REQUIRED [COMPONENTS cuda]). Eigen stays private
# to the reference (a build-time dependency, $<BUILD_INTERFACE:...> in reference/); the CUDA
# layer needs the CUDA Toolkit (CUDA::cudart_static), found by the config file.
# NOT installed: the test, harness, golden and fault-injection libraries, kvlayer_cuda_internal,
# and the `kvlayer` CLI (a development tool: it links the harness and rapidcheck, and its
# selfcheck reads golden/data from this source tree by absolute path).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(kvlayer_install_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/kvlayer)
set(kvlayer_installed_targets kvlayer_core kvlayer_reference)
if(KVLAYER_HAVE_CUDA)
  list(APPEND kvlayer_installed_targets kvlayer_cuda)
endif()

install(TARGETS ${kvlayer_installed_targets}
  EXPORT kvlayerTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/ ${PROJECT_SOURCE_DIR}/reference/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
if(KVLAYER_HAVE_CUDA)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/cuda/include/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
endif()

install(EXPORT kvlayerTargets
  NAMESPACE kvlayer::
  FILE kvlayerTargets.cmake
  DESTINATION ${kvlayer_install_cmakedir})

# What the config file records about this build (the CUDA layer's toolkit and architectures).
set(KVLAYER_CONFIG_CUDA_VERSION_MAJOR "")
set(KVLAYER_CONFIG_CUDA_ARCHITECTURES "")
if(KVLAYER_HAVE_CUDA)
  set(KVLAYER_CONFIG_CUDA_VERSION_MAJOR ${CUDAToolkit_VERSION_MAJOR})
  set(KVLAYER_CONFIG_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvlayerConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvlayerConfig.cmake
  INSTALL_DESTINATION ${kvlayer_install_cmakedir})
# SameMinorVersion: before 1.0 a minor release may change the API (semver's 0.y rule), so
# find_package(kvlayer 0.1) accepts 0.1.z only, never 0.2.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvlayerConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvlayerConfig.cmake
              ${PROJECT_BINARY_DIR}/kvlayerConfigVersion.cmake
  DESTINATION ${kvlayer_install_cmakedir})

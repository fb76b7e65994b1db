# Finds LibTorch for the trainer and defines the INTERFACE target `melforge_torch`. Included from
# trainer/CMakeLists.txt, so the variables LibTorch's config sets (CUDA flags, CMAKE_CUDA_ARCHITECTURES) stay in
# the trainer's directory scope. See trainer/README.md.
#
# Where LibTorch comes from, first match wins:
#   -DTorch_DIR=<dir with TorchConfig.cmake>        used as given;
#   -DMELFORGE_TORCH_PYTHON=<python>                its torch.utils.cmake_prefix_path;
#   otherwise                                       the environment of tools/setup_torch.sh (`--venv`).
# How it is linked:
#   MELFORGE_TRAINER_CUDA=ON (default when MELFORGE_CUDA is on): LibTorch's own config (find_package(Torch)), CPU
#     and CUDA backends; needs the CUDA toolkit. Defines MELFORGE_TRAINER_HAVE_CUDA=1.
#   MELFORGE_TRAINER_CUDA=OFF: libtorch_cpu + libc10 only, imported here without LibTorch's config, which cannot
#     be loaded without a CUDA toolkit. The CUDA backend is then absent (torch::cuda::is_available() is false).

set(MELFORGE_TORCH_PYTHON "" CACHE FILEPATH
  "Python whose torch package provides LibTorch (empty: the environment of tools/setup_torch.sh)")
option(MELFORGE_TRAINER_CUDA "Link LibTorch's CUDA backend into the trainer (needs the CUDA toolkit)" ${MELFORGE_CUDA})

if(NOT Torch_DIR OR Torch_DIR STREQUAL _MELFORGE_TORCH_DIR_AUTO)
  set(_python "${MELFORGE_TORCH_PYTHON}")
  if(NOT _python)
    execute_process(COMMAND bash "${PROJECT_SOURCE_DIR}/tools/setup_torch.sh" --venv
      OUTPUT_VARIABLE _venv OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0 OR NOT EXISTS "${_venv}/.melforge-complete")
      message(FATAL_ERROR "MELFORGE_TRAINER=ON needs LibTorch. Install the pinned torch wheel with\n"
        "  bash ${PROJECT_SOURCE_DIR}/tools/setup_torch.sh\n"
        "(into ${_venv}), or pass -DTorch_DIR=<dir of TorchConfig.cmake> or -DMELFORGE_TORCH_PYTHON=<python>.")
    endif()
    set(_python "${_venv}/bin/python")
  endif()
  execute_process(COMMAND "${_python}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _prefix ERROR_VARIABLE _err OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_prefix}/Torch/TorchConfig.cmake")
    message(FATAL_ERROR "cannot get LibTorch's CMake prefix from ${_python}: ${_err}")
  endif()
  set(Torch_DIR "${_prefix}/Torch" CACHE PATH "Folder of LibTorch's TorchConfig.cmake" FORCE)
  set(_MELFORGE_TORCH_DIR_AUTO "${Torch_DIR}" CACHE INTERNAL "Torch_DIR as found through Python")
endif()

# <root>/share/cmake/Torch -> <root>, which holds include/ and lib/ (in a wheel: site-packages/torch).
get_filename_component(MELFORGE_TORCH_ROOT "${Torch_DIR}/../../.." ABSOLUTE)
foreach(_file share/cmake/Torch/TorchConfigVersion.cmake lib/libtorch_cpu.so lib/libc10.so include/torch/script.h)
  if(NOT EXISTS "${MELFORGE_TORCH_ROOT}/${_file}")
    message(FATAL_ERROR "Torch_DIR=${Torch_DIR}: ${MELFORGE_TORCH_ROOT}/${_file} is missing; melforge expects the "
      "layout of a torch wheel or of the LibTorch archive (<root>/share/cmake/Torch, <root>/lib, <root>/include)")
  endif()
endforeach()
file(STRINGS "${MELFORGE_TORCH_ROOT}/share/cmake/Torch/TorchConfigVersion.cmake" _line
  REGEX "set\\(PACKAGE_VERSION \"[0-9.]+\"\\)")
string(REGEX MATCH "[0-9][0-9.]*" MELFORGE_TORCH_VERSION "${_line}")
if(MELFORGE_TORCH_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "LibTorch ${MELFORGE_TORCH_VERSION} in ${MELFORGE_TORCH_ROOT} is too old: melforge needs 2.4 "
    "or later (tools/setup_torch.sh installs the pinned version)")
endif()

# The CUDA, cuDNN and NCCL libraries of the nvidia-* wheels beside torch. LibTorch's libraries find them at run time
# through their own RPATH; the linker needs them named, or it takes same-named but older libraries from the CUDA
# toolkit's folder on the link's -rpath (e.g. libnccl.so.2 without symbols libtorch_cuda.so needs).
file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${MELFORGE_TORCH_ROOT}/../nvidia/*/lib")
set(_rpath_link "")
foreach(_dir ${_nvidia_lib_dirs})
  list(APPEND _rpath_link "LINKER:-rpath-link,${_dir}")
endforeach()

add_library(melforge_torch INTERFACE)
target_link_options(melforge_torch INTERFACE ${_rpath_link})
# libstdc++ first among the programs' shared libraries. torch 2.11's libtorch.so exports a std::filesystem of its own
# (64 unversioned symbols, e.g. remove_all) whose calls jump to an unresolved weak symbol: a program that loads
# libtorch.so before libstdc++.so.6 has its own std::filesystem calls bound there and crashes (SIGSEGV at address 0
# in the first remove_all). Link options come before the objects and libraries on the link line, so this
# -lstdc++ makes libstdc++.so.6 the first DT_NEEDED entry, searched before libtorch.so.
target_link_options(melforge_torch INTERFACE "LINKER:--push-state,--no-as-needed" -lstdc++ "LINKER:--pop-state")

if(MELFORGE_TRAINER_CUDA)
  if(NOT MELFORGE_CUDA)
    message(FATAL_ERROR "MELFORGE_TRAINER_CUDA=ON needs MELFORGE_CUDA=ON (the CUDA toolkit)")
  endif()
  # LibTorch's config searches the default paths before its own folder: point every lookup at this LibTorch, so
  # that another one on the system (Debian's libtorch-dev in /usr/lib) is never mixed in.
  set(Caffe2_DIR "${MELFORGE_TORCH_ROOT}/share/cmake/Caffe2")
  set(TORCH_LIBRARY "${MELFORGE_TORCH_ROOT}/lib/libtorch.so")
  set(c10_LIBRARY "${MELFORGE_TORCH_ROOT}/lib/libc10.so")
  set(C10_CUDA_LIBRARY "${MELFORGE_TORCH_ROOT}/lib/libc10_cuda.so")
  # Kineto is built into the wheel's libtorch_cpu; naming it stops the config's "library kineto not found" warning
  # (it only feeds TORCH_LIBRARIES, which melforge does not use: it links the imported target `torch`).
  set(kineto_LIBRARY "${MELFORGE_TORCH_ROOT}/lib/libtorch_cpu.so")
  # Skip LibTorch's GPU detection (a try_run that needs a device): our own architectures in TORCH_CUDA_ARCH_LIST's
  # spelling. SASS only (80-real) -> 8.0; PTX (120-virtual, or plain 120: SASS and PTX) -> 12.0+PTX, which in
  # LibTorch's list means SASS and PTX, so "120-real;120-virtual" -> "12.0+PTX" alone. Others (e.g. "all") are kept.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "")
    foreach(_arch ${CMAKE_CUDA_ARCHITECTURES})
      if(_arch MATCHES "^([0-9]+)([0-9])-real$")
        set(_arch "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
      elseif(_arch MATCHES "^([0-9]+)([0-9])(-virtual)?$")
        set(_arch "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}+PTX")
      endif()
      list(APPEND TORCH_CUDA_ARCH_LIST "${_arch}")
    endforeach()
    foreach(_arch ${TORCH_CUDA_ARCH_LIST})
      if(_arch MATCHES "^(.*)\\+PTX$")
        list(REMOVE_ITEM TORCH_CUDA_ARCH_LIST "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES TORCH_CUDA_ARCH_LIST)
  endif()
  unset(CMAKE_CUDA_ARCHITECTURES)
  find_package(Torch REQUIRED CONFIG NO_DEFAULT_PATH PATHS "${Torch_DIR}")
  get_target_property(_cpu_lib torch_cpu IMPORTED_LOCATION_RELEASE)
  string(FIND "${_cpu_lib}" "${MELFORGE_TORCH_ROOT}/" _at)
  if(NOT _at EQUAL 0)
    message(FATAL_ERROR "LibTorch's config imported ${_cpu_lib}, outside ${MELFORGE_TORCH_ROOT}")
  endif()
  target_link_libraries(melforge_torch INTERFACE torch)
  target_compile_definitions(melforge_torch INTERFACE MELFORGE_TRAINER_HAVE_CUDA=1)
  set(_mode "CPU + CUDA backends")
else()
  target_include_directories(melforge_torch SYSTEM INTERFACE
    "${MELFORGE_TORCH_ROOT}/include" "${MELFORGE_TORCH_ROOT}/include/torch/csrc/api/include")
  target_link_libraries(melforge_torch INTERFACE
    "${MELFORGE_TORCH_ROOT}/lib/libtorch_cpu.so" "${MELFORGE_TORCH_ROOT}/lib/libc10.so")
  set(_mode "CPU backend only")
endif()
message(STATUS "melforge-train: LibTorch ${MELFORGE_TORCH_VERSION} from ${MELFORGE_TORCH_ROOT} (${_mode})")

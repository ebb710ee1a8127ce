# The CUDA backend: a Python-free shared library (libmemra_cuda.so) that the extension module
# dlopens when a CUDA engine is made, so `import memra` works on machines with no driver
# (DESIGN.md "One backend interface, two implementations"; ../shared/BUILD.md).
# cuBLAS / cuBLASLt come from the `nvidia-cublas` wheel (headers in nvidia/cu13/include, only
# versioned libraries in nvidia/cu13/lib); a full CUDA toolkit's own cuBLAS is used when the
# wheel is absent. MEMRA_CUBLAS_ROOT overrides the search.
set(MEMRA_HAVE_CUDA OFF)
if(MEMRA_CUDA STREQUAL "OFF")
  message(STATUS "memra: CUDA backend disabled (MEMRA_CUDA=OFF)")
  return()
endif()

macro(memra_cuda_unavailable why)
  if(MEMRA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "memra: MEMRA_CUDA=ON but ${why}")
  endif()
  message(WARNING "memra: ${why}; building without the CUDA backend (MEMRA_CUDA=AUTO)")
  return()
endmacro()

# A CUDA library built elsewhere (e.g. on a machine with more cores) installed as is.
set(MEMRA_CUDA_PREBUILT "" CACHE FILEPATH "Use this libmemra_cuda.so instead of compiling cuda/")
if(MEMRA_CUDA_PREBUILT)
  install(FILES "${MEMRA_CUDA_PREBUILT}" DESTINATION .)
  get_filename_component(MEMRA_CUDA_LIBRARY_FILE "${MEMRA_CUDA_PREBUILT}" NAME)
  set(MEMRA_HAVE_CUDA ON)
  message(STATUS "memra: using the prebuilt CUDA library ${MEMRA_CUDA_PREBUILT}")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  memra_cuda_unavailable("no CUDA compiler (nvcc) was found")
endif()

# ---- cuBLAS: the nvidia-cublas wheel of the building Python, else the toolkit's.
set(MEMRA_CUBLAS_ROOT "" CACHE PATH "Folder with include/cublas_v2.h and lib/libcublas.so.13")
if(NOT MEMRA_CUBLAS_ROOT)
  find_package(Python 3.10 COMPONENTS Interpreter)
  if(Python_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
              "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))"
      OUTPUT_VARIABLE _memra_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND EXISTS "${_memra_wheel}/include/cublas_v2.h")
      set(MEMRA_CUBLAS_ROOT "${_memra_wheel}")
    endif()
  endif()
endif()

set(CMAKE_CUDA_ARCHITECTURES ${MEMRA_CUDA_ARCHS})
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

if(MEMRA_CUBLAS_ROOT)
  find_library(MEMRA_CUBLAS NAMES cublas libcublas.so.13 PATHS "${MEMRA_CUBLAS_ROOT}/lib" NO_DEFAULT_PATH)
  find_library(MEMRA_CUBLASLT NAMES cublasLt libcublasLt.so.13 PATHS "${MEMRA_CUBLAS_ROOT}/lib" NO_DEFAULT_PATH)
  set(MEMRA_CUBLAS_INCLUDE "${MEMRA_CUBLAS_ROOT}/include")
elseif(TARGET CUDA::cublas AND TARGET CUDA::cublasLt)
  set(MEMRA_CUBLAS CUDA::cublas)
  set(MEMRA_CUBLASLT CUDA::cublasLt)
  set(MEMRA_CUBLAS_INCLUDE "")
endif()
if(NOT MEMRA_CUBLAS OR NOT MEMRA_CUBLASLT)
  memra_cuda_unavailable("cuBLAS was not found (pip install nvidia-cublas, or set MEMRA_CUBLAS_ROOT)")
endif()

file(GLOB MEMRA_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cu)
add_library(memra_cuda SHARED ${MEMRA_CUDA_SOURCES})
target_include_directories(memra_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cpp/include)
if(MEMRA_CUBLAS_INCLUDE)
  target_include_directories(memra_cuda SYSTEM PRIVATE "${MEMRA_CUBLAS_INCLUDE}")
endif()
set_target_properties(memra_cuda PROPERTIES
  CUDA_STANDARD 17
  CUDA_RUNTIME_LIBRARY Static
  # An installed wheel finds the nvidia-cublas wheel beside it in site-packages; a build tree
  # and an editable install find the libraries it was built against.
  INSTALL_RPATH "$ORIGIN/../nvidia/cu13/lib;${MEMRA_CUBLAS_ROOT}/lib"
  BUILD_RPATH "${MEMRA_CUBLAS_ROOT}/lib")
target_compile_options(memra_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
option(MEMRA_TRACE "Kernels record when their pdl_wait returns (cuda/trace.cu; diagnostics only)" OFF)
if(MEMRA_TRACE)
  # The recorder's device globals are shared by every translation unit: relocatable device code.
  target_compile_definitions(memra_cuda PRIVATE MEMRA_TRACE=1)
  set_target_properties(memra_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION ON CUDA_RESOLVE_DEVICE_SYMBOLS ON)
endif()
target_link_libraries(memra_cuda PRIVATE CUDA::cudart_static ${MEMRA_CUBLAS} ${MEMRA_CUBLASLT})
install(TARGETS memra_cuda LIBRARY DESTINATION .)
set(MEMRA_CUDA_LIBRARY_FILE "$<TARGET_FILE_NAME:memra_cuda>")
set(MEMRA_HAVE_CUDA ON)
message(STATUS "memra: building the CUDA backend for ${CMAKE_CUDA_ARCHITECTURES} (cuBLAS: ${MEMRA_CUBLAS})")

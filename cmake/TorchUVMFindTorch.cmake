# torch_uvm_find_torch(): find_package(Torch), also for PyTorch installed by pip.
#
# A pip wheel carries TorchConfig.cmake inside the Python package and its CUDA
# libraries in nvidia-* wheels, where CMake does not look. Unless Torch_DIR is
# given, ask Python where torch is; unless CUDA_nvrtc_LIBRARY is given, look
# for libnvrtc in the CUDA toolkit, then in the nvidia wheels. Shipped with the
# TorchUVM package, so programs linking torch_uvm find torch the same way.
macro(torch_uvm_find_torch)
  if(NOT TARGET torch)
    if(NOT Torch_DIR)
      find_package(Python3 COMPONENTS Interpreter QUIET)
      if(Python3_Interpreter_FOUND)
        execute_process(
          COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
          OUTPUT_VARIABLE _tuvm_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
          RESULT_VARIABLE _tuvm_rc ERROR_QUIET)
        if(_tuvm_rc EQUAL 0 AND EXISTS "${_tuvm_torch_prefix}/Torch")
          set(Torch_DIR "${_tuvm_torch_prefix}/Torch")
        endif()
        execute_process(
          COMMAND ${Python3_EXECUTABLE} -c
            "import glob, os, nvidia; print(';'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))"
          OUTPUT_VARIABLE _tuvm_nvidia_libs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      endif()
    endif()
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      # torch's config uses the old FindCUDA, which guesses the toolkit from
      # nvcc's folder (a wrapper script in /usr/local/bin misleads it) and
      # looks for libraries in fewer places: hand it what CUDAToolkit found.
      list(GET CUDAToolkit_INCLUDE_DIRS 0 _tuvm_cuda_include)
      if(NOT CUDA_TOOLKIT_ROOT_DIR)
        get_filename_component(CUDA_TOOLKIT_ROOT_DIR "${_tuvm_cuda_include}" DIRECTORY)
      endif()
      if(NOT CUDA_TOOLKIT_INCLUDE)
        set(CUDA_TOOLKIT_INCLUDE "${_tuvm_cuda_include}" CACHE PATH "CUDA headers")
      endif()
      if(NOT CUDA_CUDART_LIBRARY AND CUDA_cudart_LIBRARY)
        set(CUDA_CUDART_LIBRARY "${CUDA_cudart_LIBRARY}" CACHE FILEPATH "libcudart")
      endif()
    endif()
    if(NOT CUDA_nvrtc_LIBRARY)
      find_library(CUDA_nvrtc_LIBRARY
        NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12
        HINTS ${CUDAToolkit_LIBRARY_DIR} ${_tuvm_nvidia_libs})
    endif()
    find_package(Torch REQUIRED)
  endif()
  # The C++ standard torch's headers need (C++20 from torch 2.13, else 17).
  get_target_property(TORCH_UVM_CXX_STANDARD torch CXX_STANDARD)
  if(NOT TORCH_UVM_CXX_STANDARD OR TORCH_UVM_CXX_STANDARD LESS 17)
    set(TORCH_UVM_CXX_STANDARD 17)
  endif()
endmacro()

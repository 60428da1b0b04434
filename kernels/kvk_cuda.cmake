# The CUDA path of issue 9 (docs/cuda.md): CPU references (kvk_ops.c) always; the CUDA kernels
# (kernels/cuda/*.cu, cuBLAS) when nvcc was found, else -ENODEV stubs in kvk_nocuda.c; the NCCL
# transfer when CUDA and libnccl are both found, else -ENODEV stubs (kvk_nccl_none.c).
# Included from kernels/CMakeLists.txt after kvfs_kernels is defined.
target_sources(kvfs_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kvk_ops.c)
# The device-backend layer (kvk_dev.h): host (references) and cuda (kvk_cu_*, -ENODEV stubs
# without CUDA) backends, built in every configuration.
target_sources(kvfs_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kvk_dev_host.c
	${CMAKE_CURRENT_LIST_DIR}/kvk_dev_cuda.c)
set(KVFS_HAVE_NCCL OFF)
set(KVK_CU_FILES
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_ctx.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_elem.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_attn.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_gemm.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_kq.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_sample.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_kvpack.cu
	${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_fwd.cu)
if(KVFS_CUDA_EMU)
	# The same sources on the CPU (docs/cuda-emu.md), NCCL included (ranks in one process).
	include(${PROJECT_SOURCE_DIR}/tests/cuda-emu/kvk_emu.cmake)
	kvk_emu_add_cu(kvfs_kernels ${KVK_CU_FILES} ${CMAKE_CURRENT_LIST_DIR}/cuda/rmsnorm.cu
		${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_nccl.cu)
	set(KVFS_HAVE_NCCL ON)
elseif(KVFS_HAVE_CUDA)
	target_sources(kvfs_kernels PRIVATE ${KVK_CU_FILES})
	target_link_libraries(kvfs_kernels PUBLIC CUDA::cublas)
	# nvcc: warnings of the host compiler and of device code are errors too.
	target_compile_options(kvfs_kernels PRIVATE
		"$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra;-Werror=all-warnings>")
	find_path(KVFS_NCCL_INCLUDE nccl.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
	find_library(KVFS_NCCL_LIB nccl HINTS /usr/local/cuda/lib /usr/local/cuda/lib64
		${CUDAToolkit_LIBRARY_DIR})
	if(KVFS_NCCL_INCLUDE AND KVFS_NCCL_LIB)
		set(KVFS_HAVE_NCCL ON)
		target_sources(kvfs_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda/kvk_nccl.cu)
		target_include_directories(kvfs_kernels PRIVATE ${KVFS_NCCL_INCLUDE})
		target_link_libraries(kvfs_kernels PUBLIC ${KVFS_NCCL_LIB})
	endif()
endif()
if(NOT KVFS_HAVE_NCCL)
	target_sources(kvfs_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kvk_nccl_none.c)
endif()
message(STATUS "kvfs: NCCL KV transfer ${KVFS_HAVE_NCCL}")

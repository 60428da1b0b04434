# kvk_emu (tests/cuda-emu, docs/cuda-emu.md): the project's CUDA sources compiled as C++ against an
# emulated CUDA runtime / cuBLAS / NCCL that runs them on the CPU. Configured with
# -DKVFS_CUDA=EMU; included from kernels/CMakeLists.txt.
set(KVK_EMU_DIR ${CMAKE_CURRENT_LIST_DIR} CACHE INTERNAL "tests/cuda-emu")
add_library(kvk_emu STATIC
	${KVK_EMU_DIR}/kvk_emu_rt.cc
	${KVK_EMU_DIR}/kvk_emu_sm.cc
	${KVK_EMU_DIR}/kvk_emu_blas.cc
	${KVK_EMU_DIR}/kvk_emu_nccl.cc)
target_include_directories(kvk_emu PRIVATE ${KVK_EMU_DIR}/include)
target_link_libraries(kvk_emu PUBLIC Threads::Threads m)
set(KVK_EMU_CXX_FLAGS -Wall -Wextra -Werror -Wno-unknown-pragmas -fno-strict-aliasing
	CACHE INTERNAL "flags of the emulated CUDA sources")
target_compile_options(kvk_emu PRIVATE ${KVK_EMU_CXX_FLAGS})
set_target_properties(kvk_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
if(KVFS_TSAN)
	# The block scheduler's own state passes between fibers that TSan is told do not
	# synchronize (that is how it sees races between CUDA threads); it is not instrumented,
	# and tells TSan where the kernels' barriers are (kvk_emu_sm.cc).
	set_source_files_properties(${KVK_EMU_DIR}/kvk_emu_sm.cc PROPERTIES
		COMPILE_OPTIONS "-fno-sanitize=thread;-DKVK_EMU_TSAN=1")
endif()

# kvk_emu_add_cu(target file.cu ...): rewrites each file with cu2cc.pl into the build tree and
# compiles the result into target as C++ with the emulator's headers first on the path.
function(kvk_emu_add_cu target)
	foreach(cu ${ARGN})
		get_filename_component(name ${cu} NAME_WE)
		get_filename_component(dir ${cu} DIRECTORY)
		set(out ${CMAKE_CURRENT_BINARY_DIR}/emu/${name}.cc)
		add_custom_command(OUTPUT ${out}
			COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/emu
			COMMAND perl ${KVK_EMU_DIR}/cu2cc.pl ${cu} ${out}
			DEPENDS ${cu} ${KVK_EMU_DIR}/cu2cc.pl
			COMMENT "kvk_emu: ${name}.cu -> ${name}.cc")
		target_sources(${target} PRIVATE ${out})
		# quoted includes of the .cu resolve next to it, not next to the generated file
		set_source_files_properties(${out} PROPERTIES
			INCLUDE_DIRECTORIES "${KVK_EMU_DIR}/include;${dir}"
			COMPILE_OPTIONS "${KVK_EMU_CXX_FLAGS}")
	endforeach()
	target_link_libraries(${target} PUBLIC kvk_emu)
	set_target_properties(${target} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
endfunction()

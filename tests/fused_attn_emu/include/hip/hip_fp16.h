// empty stand-in: ggml-common.h includes it for half and half2, which cuda_surface.h defines
#pragma once

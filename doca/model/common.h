/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */
/* libdoca_common's private declarations, shared by its common_*.c files only
 * (the other libraries reach the shared state through the model_* functions
 * declared in model.h). */
#ifndef DOCA_MODEL_COMMON_H
#define DOCA_MODEL_COMMON_H

#include "model.h"

/* Shared between the common_*.c files, not exported (the libraries are also
 * compiled with -fvisibility=hidden). */
#define MODEL_HIDDEN __attribute__((visibility("hidden")))

struct doca_dev {
	uint32_t magic;
	struct doca_devinfo *info;
	/* mmaps holding it (add_dev / import) and contexts created on it */
	unsigned users;
};

/* Whether two handles are the same device (common_dev.c). */
MODEL_HIDDEN int model_same_device(const struct doca_dev *a, const struct doca_dev *b);

#endif /* DOCA_MODEL_COMMON_H */

/* The DOCA headers whose declarations doca-sys mirrors. Used only by the
 * `bindgen-check` feature, on a machine where DOCA is installed; the headers
 * themselves are NVIDIA's and are never copied into this repository. */
#include <doca_error.h>
#include <doca_types.h>
#include <doca_dev.h>
#include <doca_mmap.h>
#include <doca_buf.h>
#include <doca_buf_inventory.h>
#include <doca_pe.h>
#include <doca_ctx.h>
#include <doca_dma.h>
#include <doca_comch.h>
#include <doca_aes_gcm.h>
#include <doca_rdma_bridge.h>

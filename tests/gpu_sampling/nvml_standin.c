/*
 * A stand-in for NVIDIA's NVML library (libnvidia-ml.so.1), for machines without a GPU.
 *
 * It implements the calls ffdl's GPU sampler makes through nvidia-ml-py and answers them
 * from a text file beside the library itself, nvml-standin.txt, one GPU a line:
 *
 *     <utilisation %> <memory used MiB> <memory total MiB> <power mW>
 *
 * The file is read again at every call, so a test changes the figures by replacing it.
 * Built by the tests: cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define MAX_GPUS 64
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_UNKNOWN 999

typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
typedef struct { unsigned int util; unsigned long long used_mib, total_mib; unsigned int power_mw; } gpu_t;

static int read_gpus(gpu_t *gpus) {
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr((void *)read_gpus, &info) || !info.dli_fname) return -1;
    strncpy(path, info.dli_fname, sizeof path - 1);
    path[sizeof path - 1] = '\0';
    char *slash = strrchr(path, '/');
    if (slash) slash[1] = '\0'; else path[0] = '\0';
    strncat(path, "nvml-standin.txt", sizeof path - strlen(path) - 1);
    FILE *file = fopen(path, "r");
    if (!file) return -1;
    int count = 0;
    while (count < MAX_GPUS && fscanf(file, "%u %llu %llu %u", &gpus[count].util,
                                      &gpus[count].used_mib, &gpus[count].total_mib,
                                      &gpus[count].power_mw) == 4) {
        count++;
    }
    fclose(file);
    return count;
}

static int lookup(void *device, gpu_t *gpu) {
    gpu_t gpus[MAX_GPUS];
    long index = (long)device - 1;
    int count = read_gpus(gpus);
    if (count < 0) return NVML_ERROR_UNKNOWN;
    if (index < 0 || index >= count) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = gpus[index];
    return NVML_SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; gpu_t g[MAX_GPUS]; return read_gpus(g) < 0 ? NVML_ERROR_UNKNOWN : NVML_SUCCESS; }
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return NVML_SUCCESS; }
const char *nvmlErrorString(int result) { return result == NVML_SUCCESS ? "Success" : "stand-in NVML error"; }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    gpu_t gpus[MAX_GPUS];
    int found = read_gpus(gpus);
    if (found < 0) return NVML_ERROR_UNKNOWN;
    *count = (unsigned int)found;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    unsigned int count;
    int status = nvmlDeviceGetCount_v2(&count);
    if (status != NVML_SUCCESS) return status;
    if (index >= count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (void *)(long)(index + 1);
    return NVML_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization) {
    gpu_t gpu;
    int status = lookup(device, &gpu);
    if (status != NVML_SUCCESS) return status;
    utilization->gpu = gpu.util;
    utilization->memory = gpu.util;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    gpu_t gpu;
    int status = lookup(device, &gpu);
    if (status != NVML_SUCCESS) return status;
    memory->total = gpu.total_mib << 20;
    memory->used = gpu.used_mib << 20;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *device, unsigned int *milliwatts) {
    gpu_t gpu;
    int status = lookup(device, &gpu);
    if (status != NVML_SUCCESS) return status;
    *milliwatts = gpu.power_mw;
    return NVML_SUCCESS;
}

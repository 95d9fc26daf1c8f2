// Preloaded (LD_PRELOAD) into every process of the sanitizer stage (scripts/sanitize.sh): keeps
// each shared library loaded until exit. The Vulkan loader unloads the validation layer at
// vkDestroyInstance; LeakSanitizer, which checks at exit, would then see the few KB the layer
// never frees coming from an unknown module, which no suppression can name. Kept loaded, the
// module has a name, and tests/sanitizers/lsan.supp suppresses exactly it.
extern "C" int dlclose(void*) {
    return 0;  // success, and the library stays mapped
}

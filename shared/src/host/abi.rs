//! Raw imports of the proxy-wasm ABI 0.2.1, declared with `u32` statuses.
//!
//! The SDK declares them returning its `Status` enum, which lacks several values Envoy does
//! return (`BadExpression` 5, `InvalidMemoryAccess` 6, `ResultMismatch` 9,
//! `BrokenConnection` 11, `Unimplemented` 12): an unknown discriminant in a Rust enum is
//! undefined behaviour. A `u32` holds any of them.
#![allow(unsafe_code)]

#[link(wasm_import_module = "env")]
extern "C" {
    pub fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    pub fn proxy_get_log_level(return_level: *mut u32) -> u32;
    pub fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    pub fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    pub fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32;
    pub fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    pub fn proxy_set_header_map_pairs(map_type: u32, map_data: *const u8, map_size: usize) -> u32;
    pub fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    pub fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    pub fn proxy_add_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    pub fn proxy_remove_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
    ) -> u32;
    pub fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    pub fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    pub fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    pub fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    pub fn proxy_register_shared_queue(
        queue_name_data: *const u8,
        queue_name_size: usize,
        return_queue_id: *mut u32,
    ) -> u32;
    pub fn proxy_enqueue_shared_queue(
        queue_id: u32,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    pub fn proxy_dequeue_shared_queue(
        queue_id: u32,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    pub fn proxy_continue_stream(stream_type: u32) -> u32;
    pub fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    // proxy_http_call: called through the SDK, whose dispatcher must register the token
    // (see `host::dispatch_http_call`).
    pub fn proxy_set_effective_context(context_id: u32) -> u32;
    pub fn proxy_call_foreign_function(
        function_name_data: *const u8,
        function_name_size: usize,
        arguments_data: *const u8,
        arguments_size: usize,
        results_data: *mut *mut u8,
        results_size: *mut usize,
    ) -> u32;
    pub fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    pub fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    pub fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    pub fn proxy_get_metric(metric_id: u32, return_value: *mut u64) -> u32;
}

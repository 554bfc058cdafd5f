//! `scripts/package-oci` over the real Higress builds `dist/higress/*.wasm` (built by
//! `scripts/build`): the OCI image layouts istio's (Higress's) Wasm fetcher pulls — "oci"
//! variant, two layers, the raw module in the `application/vnd.module.wasm.content.layer.v1+wasm`
//! one, `abiVersions` `proxy_abi_version_0_2_100` — the same in the tar, the same digests on
//! every run, the image each WasmPlugin's `url` names; and a plain (`_0_2_1`) build refused.

use crate::common::*;
use llm_gateway_tests::workspace::{self, sha256_hex, TempDir};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const CONFIG: &str = "application/vnd.module.wasm.config.v1+json";
const CONTENT: &str = "application/vnd.module.wasm.content.layer.v1+wasm";

/// The modules package-oci must package: each plugin's Higress build, under the plugin's name.
fn expected_modules() -> Vec<(String, PathBuf)> {
    CHAIN
        .iter()
        .map(|plugin| {
            let path = workspace::higress_wasm(plugin).unwrap_or_else(|e| panic!("{e}"));
            (plugin.to_string(), path)
        })
        .collect()
}

fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A descriptor's blob, checked against its digest and size.
fn blob(layout: &Path, desc: &Value) -> Vec<u8> {
    let digest = desc["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let bytes = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    assert_eq!(sha256_hex(&bytes), hex, "blob {digest} has other content");
    assert_eq!(
        desc["size"].as_u64(),
        Some(bytes.len() as u64),
        "size of {digest}"
    );
    bytes
}

/// The regular files of a tar as path → bytes; refuses anything but plain USTAR headers
/// (oras-go's tar reader takes each header to be one 512-byte block: no PAX/GNU extensions).
fn tar_files(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() % 512, 0, "{}: not whole blocks", path.display());
    let mut files = BTreeMap::new();
    let mut pos = 0;
    while pos + 512 <= data.len() {
        let header = &data[pos..pos + 512];
        if header.iter().all(|&b| b == 0) {
            break;
        }
        assert_eq!(&header[257..263], b"ustar\0", "not a USTAR header");
        let field = |range: std::ops::Range<usize>| {
            let raw = &header[range];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            String::from_utf8(raw[..end].to_vec()).unwrap()
        };
        let name = field(0..100);
        assert!(field(345..500).is_empty(), "{name}: prefix field used");
        let size = usize::from_str_radix(field(124..136).trim(), 8).unwrap();
        let mtime = u64::from_str_radix(field(136..148).trim(), 8).unwrap();
        assert_eq!(mtime, 0, "{name}: mtime not fixed");
        let kind = header[156];
        let start = pos + 512;
        match kind {
            b'0' | 0 => {
                files.insert(name, data[start..start + size].to_vec());
            }
            b'5' => assert_eq!(size, 0),
            other => panic!("{name}: tar entry type {:?}", other as char),
        }
        pos = start + size.div_ceil(512) * 512;
    }
    files
}

fn dir_files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn package_oci_writes_layouts_the_wasm_fetcher_pulls() {
    let tmp = TempDir::new("package-oci").unwrap();
    let out = tmp.path().join("oci");
    let stdout = run_package_oci(&workspace::wasm_dir(), &out);
    let tag = env!("CARGO_PKG_VERSION"); // the workspace version

    let modules = expected_modules();
    for (name, wasm_path) in &modules {
        let layout = out.join(name);
        let wasm = std::fs::read(wasm_path).unwrap();

        assert_eq!(
            read_json(&layout.join("oci-layout")),
            serde_json::json!({"imageLayoutVersion": "1.0.0"})
        );
        let index = read_json(&layout.join("index.json"));
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(index["mediaType"], INDEX);
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 1, "{name}");
        let desc = &manifests[0];
        assert_eq!(desc["mediaType"], MANIFEST);
        assert_eq!(
            desc["annotations"]["org.opencontainers.image.ref.name"], tag,
            "{name}: the tag"
        );

        let manifest: Value = serde_json::from_slice(&blob(&layout, desc)).unwrap();
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["mediaType"], MANIFEST);
        assert_eq!(manifest["config"]["mediaType"], CONFIG);
        let config_bytes = blob(&layout, &manifest["config"]);
        let config: Value = serde_json::from_slice(&config_bytes).unwrap();
        assert_eq!(config["type"], "envoy_proxy");
        // the ABI Higress's host delivers the body to after a headers Pause
        assert_eq!(
            config["abiVersions"],
            serde_json::json!(["proxy_abi_version_0_2_100"]),
            "{name}: {config}"
        );

        // istio's extractOCIArtifactImage: exactly two layers, the module in the +wasm one
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 2, "{name}");
        let of_type = |t: &str| {
            let found: Vec<&Value> = layers.iter().filter(|l| l["mediaType"] == t).collect();
            assert_eq!(found.len(), 1, "{name}: one layer of {t}");
            found[0]
        };
        let content = of_type(CONTENT);
        assert_eq!(
            content["digest"],
            format!("sha256:{}", sha256_hex(&wasm)),
            "{name}: layer digest"
        );
        assert!(
            blob(&layout, content) == wasm,
            "{name}: the layer is not the .wasm"
        );
        assert_eq!(blob(&layout, of_type(CONFIG)), config_bytes);

        // nothing else in the layout, and the tar holds the same files
        let files = dir_files(&layout);
        assert_eq!(files.len(), 5, "{name}: {:?}", files.keys());
        assert_eq!(
            tar_files(&out.join(format!("{name}.tar"))),
            files,
            "{name}.tar"
        );

        // the push command it prints: `oras cp --from-oci-layout <dir>:<tag> <registry>/…`
        assert!(
            stdout
                .lines()
                .any(|l| l.contains("oras cp --from-oci-layout ")
                    && l.contains(&format!("{name}:{tag} REGISTRY/llm-gateway/{name}:{tag}"))),
            "{name}: no oras command in {stdout}"
        );
    }

    // only plugins: the harness's fixture module is not packaged
    let packaged: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".tar"))
        .collect();
    assert_eq!(packaged.len(), modules.len(), "{packaged:?}");
    assert!(!out.join("redis-probe").exists());
}

#[test]
fn package_oci_is_deterministic() {
    let tmp = TempDir::new("package-oci-twice").unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run_package_oci(&workspace::wasm_dir(), &a);
    run_package_oci(&workspace::wasm_dir(), &b);
    for (name, _) in expected_modules() {
        let index = std::fs::read(a.join(&name).join("index.json")).unwrap();
        assert_eq!(
            index,
            std::fs::read(b.join(&name).join("index.json")).unwrap(),
            "{name}"
        );
        let tar = |dir: &Path| std::fs::read(dir.join(format!("{name}.tar"))).unwrap();
        assert!(tar(&a) == tar(&b), "{name}.tar differs between runs");
    }
    // a different module gives a different digest (the check above can fail)
    let index =
        |name: &str| read_json(&a.join(name).join("index.json"))["manifests"][0]["digest"].clone();
    assert_ne!(index("key-auth"), index("model-router"));
}

#[test]
fn package_oci_refuses_what_is_not_a_plugin_module() {
    let tmp = TempDir::new("package-oci-bad").unwrap();
    let dist = tmp.path().join("dist");
    let higress = dist.join("higress");
    std::fs::create_dir_all(&higress).unwrap();
    let run = || {
        std::process::Command::new(package_oci_script())
            .arg("--dist")
            .arg(&dist)
            .output()
            .unwrap()
    };
    std::fs::write(higress.join("key-auth.wasm"), b"not wasm at all").unwrap();
    let status = run();
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("not a WebAssembly module"));
    // the plain build (ABI 0_2_1) where the Higress build belongs: its body-reading plugins
    // would hang on Higress, so it is refused
    let plain = workspace::plugin_wasm("key-auth").unwrap();
    std::fs::copy(&plain, higress.join("key-auth.wasm")).unwrap();
    let status = run();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(!status.status.success(), "{stderr}");
    assert!(stderr.contains("not a Higress build"), "{stderr}");
    // the Higress build itself is packaged (the refusal above was the ABI)
    std::fs::copy(
        workspace::higress_wasm("key-auth").unwrap(),
        higress.join("key-auth.wasm"),
    )
    .unwrap();
    assert!(run().status.success());
    // an empty dist: nothing to package is an error, not an empty success
    std::fs::remove_file(higress.join("key-auth.wasm")).unwrap();
    let status = std::process::Command::new(package_oci_script())
        .arg("--dist")
        .arg(&dist)
        .output()
        .unwrap();
    assert!(!status.status.success());
}

#[test]
fn every_wasm_plugin_url_names_a_packaged_image() {
    let tmp = TempDir::new("package-oci-urls").unwrap();
    let out = tmp.path().join("oci");
    run_package_oci(&workspace::wasm_dir(), &out);
    for doc in wasm_plugins() {
        let (name, tag) = plugin_image(&doc);
        let index = out.join(&name).join("index.json");
        assert!(
            index.is_file(),
            "{}: package-oci made no image {name}",
            doc.at()
        );
        let index = read_json(&index);
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            tag,
            "{}: tag",
            doc.at()
        );
    }
}

//! The packaging suites: what ships to Higress — the two ABI builds of every module
//! (`abi`), the CRDs of `higress/*.yaml` (`crds`), the chain exactly as those CRDs configure
//! it, in the harness's Higress mode (`higress_chain`), and the OCI images
//! `scripts/package-oci` makes (`oci`). `tests/README.md` indexes the modules.

mod abi;
mod common;
mod crds;
mod higress_chain;
mod oci;

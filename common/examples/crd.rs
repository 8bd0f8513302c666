//! Prints the ClusterRing CRD generated from the types (`make crd` writes it into the chart).

fn main() {
    match sharder_common::cluster_ring::crd_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    }
}

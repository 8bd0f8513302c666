//! Prints the CRD of a ring kind (`clusterring`, `controllerring`) generated from the types
//! (`make crd` writes both into the chart).

fn main() {
    let kind = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "clusterring".to_owned());
    let crd = kind
        .parse()
        .and_then(sharder_common::cluster_ring::crd_yaml);
    match crd {
        Ok(yaml) => print!("{yaml}"),
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    }
}

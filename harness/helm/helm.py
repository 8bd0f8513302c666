"""The chart tests' Helm: a thin command line over the real Helm v4 SDK (PyPI helm-python-sdk).

Every command prints one JSON document on stdout; a Helm error exits 1 with the message on
stderr.

    helm.py lint CHART [--values JSON] [--kube-version V]
    helm.py render CHART --name N --namespace NS [--values JSON] [--upgrade]
    helm.py install CHART --name N --namespace NS --kubeconfig FILE [--values JSON]
    helm.py upgrade CHART --name N --namespace NS --kubeconfig FILE [--values JSON]
    helm.py uninstall --name N --namespace NS --kubeconfig FILE
"""

import argparse
import json
import sys

import helm_python as helm


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["lint", "render", "install", "upgrade", "uninstall"])
    parser.add_argument("chart", nargs="?")
    parser.add_argument("--values", default="{}")
    parser.add_argument("--name")
    parser.add_argument("--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--kube-version")
    parser.add_argument("--upgrade", action="store_true")
    args = parser.parse_args()
    values = json.loads(args.values)
    try:
        if args.command == "lint":
            out = helm.lint(args.chart, values, kube_version=args.kube_version)
        elif args.command == "render":
            with helm.Chart.load(args.chart) as chart:
                out = chart.render(
                    values,
                    name=args.name,
                    namespace=args.namespace,
                    is_install=not args.upgrade,
                    is_upgrade=args.upgrade,
                )
        else:
            with helm.Config(kubeconfig_path=args.kubeconfig, namespace=args.namespace) as cfg:
                if args.command == "install":
                    out = cfg.install(args.chart, args.name, values, namespace=args.namespace, timeout=120)
                elif args.command == "upgrade":
                    out = cfg.upgrade(args.chart, args.name, values, namespace=args.namespace, timeout=120)
                else:
                    out = cfg.uninstall(args.name, wait="watcher", timeout=120)
    except helm.HelmError as e:  # every Helm failure
        print(f"helm {args.command}: {e}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

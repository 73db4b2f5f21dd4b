"""The kit's subcommands of `ddp-lab`: check (the attendees' pre-flight), workshop, site."""
from __future__ import annotations


def add_commands(sub) -> None:
    sub.add_parser("check", help="pre-flight check for a workshop: python, torch, two ranks, "
                   "DeepSpeed's op, JupyterLab").set_defaults(func=check)
    ws = sub.add_parser("workshop", help="the workshop kit: student and instructor notebooks, slides, guide")
    ws.add_argument("action", choices=["build"])
    ws.add_argument("out", help="output folder")
    ws.add_argument("--notebooks", default="notebooks", help="folder of executed lesson notebooks")
    ws.add_argument("--slides-assets", default=None, metavar="NODE_MODULES",
                    help="offline slides: an npm node_modules with reveal.js@4.0.2 and requirejs "
                         "(npm install --prefix DIR reveal.js@4.0.2 requirejs@2.3.7)")
    ws.set_defaults(func=build_workshop)
    site = sub.add_parser("site", help="a static HTML site of the executed notebooks")
    site.add_argument("action", choices=["build"])
    site.add_argument("out", help="output folder")
    site.add_argument("--notebooks", default="notebooks", help="folder of executed lesson notebooks")
    site.add_argument("--repository", metavar="URL", default=None,
                      help="the repository's web address every page links to (default: git's "
                           "`origin` remote, when it is a web address; no link without one)")
    site.set_defaults(func=build_site)


def check(args) -> int:
    from .preflight import preflight

    return preflight()


def build_workshop(args) -> int:
    from .workshop import build_workshop

    build_workshop(args.out, notebooks=args.notebooks, slides_assets=args.slides_assets)
    return 0


def build_site(args) -> int:
    from .site import build_site

    build_site(args.out, notebooks=args.notebooks, repository=args.repository)
    return 0

"""The site's look: fonts, the sticky top bar, the table of contents, and the rules that keep
every page readable at a phone's width (420 px) without widening the page."""
from __future__ import annotations

# The lessons quote Chinese (00, 04, 05): name CJK fonts after the Latin ones, so a machine with
# any of them shows the characters, not empty boxes (binder/apt.txt installs fonts-noto-cjk).
CJK = "'Noto Sans CJK SC','Noto Sans SC','Source Han Sans SC','PingFang SC','Microsoft YaHei','WenQuanYi Micro Hei'"
FONTS = f"system-ui,-apple-system,'Segoe UI',helvetica,arial,{CJK},sans-serif"
MONO = f"menlo,consolas,'DejaVu Sans Mono',{CJK.replace('Sans', 'Sans Mono', 1)},{CJK},monospace"
# No favicon.ico request (a 404 on every static host without one): an empty icon, inline.
ICON = '<link rel="icon" href="data:,">'
VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'

STYLE = ICON + f"""<style>
:root{{--jp-content-font-family:{FONTS};--jp-ui-font-family:{FONTS};--jp-code-font-family:{MONO}}}
html{{scroll-padding-top:3.5em}}
[id]{{scroll-margin-top:3.5em}}
.ddp-nav{{display:flex;gap:1.2em;padding:.6em 1em;border-bottom:1px solid #ccc;font-size:15px;
  font-family:{FONTS};position:sticky;top:0;background:#fff;z-index:10;white-space:nowrap;
  overflow-x:auto;line-height:1.4}}
.ddp-nav a,.ddp-toc a,.ddp-foot a{{color:#0645ad}}.ddp-nav a{{text-decoration:none}}
.ddp-nav .ddp-here{{font-weight:600}}
.ddp-foot{{display:flex;gap:1.5em;padding:.8em 1em;border-top:1px solid #ccc;font-size:15px;
  font-family:{FONTS};flex-wrap:wrap}}
.ddp-index,.ddp-doc{{font-size:16px;font-family:{FONTS};max-width:60em;margin:1.5em auto;
  padding:0 1em;line-height:1.5}}
.ddp-doc{{max-width:52em}}
.ddp-index table,.ddp-doc table{{border-collapse:collapse;width:100%}}
.ddp-index td,.ddp-index th,.ddp-doc td,.ddp-doc th{{padding:.3em .6em;border-bottom:1px solid #ddd;
  text-align:left;vertical-align:top}}
.ddp-scroll{{overflow-x:auto;max-width:100%}}
.ddp-doc pre,.ddp-index pre{{overflow-x:auto;background:#f6f6f6;padding:.6em;font-size:14px}}
.ddp-doc code,.ddp-index code,.jp-RenderedMarkdown code{{font-family:{MONO};overflow-wrap:anywhere}}
.ddp-doc pre code{{overflow-wrap:normal}}
.ddp-toc{{font-family:{FONTS};font-size:15px;max-width:50em;margin:1em auto;padding:.5em 1em;
  border:1px solid #ddd;border-radius:4px;background:#fafafa}}
.ddp-toc ol{{margin:.3em 0 0;padding-left:1.5em}}
.jp-RenderedImage{{overflow-x:auto}}
/* nbconvert's lab CSS clips the input area (.jp-InputArea-editor{{overflow:hidden}}): a line
   longer than the window was cut off, with no scrollbar (issue 47); the code scrolls instead */
.jp-InputArea-editor .highlight pre{{overflow-x:auto}}
@media (max-width:700px){{
  .jp-InputPrompt,.jp-OutputPrompt{{display:none}}
  .jp-RenderedImage img{{max-width:none}}
  .ddp-lessons thead{{display:none}}
  .ddp-lessons tr{{display:block;border-bottom:1px solid #ddd;padding:.4em 0}}
  .ddp-lessons td{{display:block;border:0;padding:.1em .2em}}
  .ddp-lessons td:first-child,.ddp-lessons td:nth-child(2){{display:inline}}
  .ddp-lessons td:nth-child(4):not(:empty)::before{{content:"try it: ";font-style:italic}}
}}
</style>"""

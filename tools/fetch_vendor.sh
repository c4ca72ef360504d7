#!/usr/bin/env bash
# Fetches the chat page's pinned npm packages into serving/http/static/vendor/ (committed: the
# page and its tests need no network). Each tarball is checked against the integrity npm
# published for it before anything is copied; only the minified dist files, the licences and
# KaTeX's woff2 fonts are kept. Run from anywhere: tools/fetch_vendor.sh (or `make vendor`).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/serving/http/static/vendor"
# name@version -> npm's dist.integrity (sha512 of the tarball)
PINS=(
  "markdown-it@15.0.3 sha512-+Az7Ojz3iRGu8KYMvJ6xVhvrxP3eE+vEtJX75Ow88XBpcQNV/0lGX5ZynIIBftREo4DC2jsveAMDaeltmm8QvQ=="
  "dompurify@3.5.0 sha512-LYC0ZkE8P1V42JsRYTwMdme/2ET8SpOc5AA2eOFjP/IadvRd2fwiT4TVz5vkfy0XUx12aS2UaRkTnfVPNOv9vw=="
  "@highlightjs/cdn-assets@11.12.0 sha512-KvOKXODaiFmId9xaq3xc5xCL66wVLUuOngDbO9B/kewbFTqdGbn2nJxNhN3H5R1cgDTVj6R8vH0zgiNDEGjpDw=="
  "katex@0.19.1 sha512-jG8uKntjSEcm2EpQOh0XturpPuuC9r3Sq5HLHdsFdWZT27E672SF19QEi+of0/YeOy15lDgRhKvr5614uRrEfA=="
)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
for pin in "${PINS[@]}"; do
  spec="${pin% *}" want="${pin#* }"
  tarball="$(npm pack "$spec" --silent)"
  got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  if [ "$got" != "$want" ]; then
    echo "fetch_vendor: $spec: integrity $got, pinned $want; refusing to vendor it" >&2
    exit 1
  fi
  name="${spec%@*}" name="${name##*/}"
  mkdir -p "$name" && tar xzf "$tarball" -C "$name"
done

NEW="$DEST.new"  # beside DEST: the swap below is a rename
rm -rf "$NEW"
mkdir -p "$NEW"/{markdown-it,dompurify,highlight,katex/fonts}
cp markdown-it/package/dist/browser/markdown-it.umd.min.js markdown-it/package/LICENSE "$NEW/markdown-it/"
cp dompurify/package/dist/purify.min.js dompurify/package/LICENSE "$NEW/dompurify/"
cp cdn-assets/package/highlight.min.js cdn-assets/package/LICENSE "$NEW/highlight/"
cp katex/package/dist/katex.min.js katex/package/LICENSE "$NEW/katex/"
cp katex/package/dist/fonts/*.woff2 "$NEW/katex/fonts/"
# browsers take the first source they can read (woff2, which every current one reads): the
# woff and ttf fallbacks, not shipped, come out of the stylesheet too
sed -E 's/,url\(fonts\/[A-Za-z0-9_-]+\.(woff|ttf)\) format\("(woff|truetype)"\)//g' \
  katex/package/dist/katex.min.css > "$NEW/katex/katex.min.css"
if grep -Eq '\.(woff|ttf)\)' "$NEW/katex/katex.min.css"; then
  echo "fetch_vendor: katex.min.css still names woff/ttf fonts; update the sed above" >&2
  exit 1
fi
printf '%s\n' "${PINS[@]%% *}" > "$NEW/VERSIONS"

# swap in whole: never a half-written vendor folder
rm -rf "$DEST.old"
[ -d "$DEST" ] && mv "$DEST" "$DEST.old"
mv "$NEW" "$DEST"
rm -rf "$DEST.old"
du -sh "$DEST"
